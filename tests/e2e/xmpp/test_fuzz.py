"""Issue 23, bad input: 10,000 mutated frames through a real WebSocket against Daphne.

Malformed XML, billion-laughs and other DTDs, processing instructions, huge frames, wrong
namespaces, stanzas before authentication (each on a stream of its own, as each ends it)
and IQs for unknown nodes, bad attributes and mutated pubsub requests (on authenticated
streams, which stay up). Every frame is answered with the profile's stream error (and the
stream closed) or an IQ reply; the server keeps serving other clients all along, logs no
failure, and stores nothing partial: exactly the publishes it answered with a result.
"""

from __future__ import annotations

import random
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from xml.sax.saxutils import escape

import pytest
import websocket

from tests.conftest import BrokerProcess, fresh_listener
from tests.e2e.xmpp.test_xmpp import SETUP, create, ok, publish, session, subscribe
from tests.support.queue_clients import store_rows
from tests.support.timing import scaled
from tests.support.xmpp_session import (
    CLIENT,
    FRAMING,
    PUBSUB,
    STREAMS,
    StreamEnded,
    XmppSession,
    daphne,
    url_log,
)

pytestmark = pytest.mark.e2e

SEED = 23
PRE_AUTH_FRAMES = 4_000
STANZA_FRAMES = 6_000
STREAM_ERRORS = {"not-well-formed", "restricted-xml", "policy-violation", "invalid-namespace",
                 "unsupported-stanza-type", "not-authorized", "host-unknown",
                 "unsupported-version"}

BILLION_LAUGHS = ("<?xml version='1.0'?><!DOCTYPE lolz [<!ENTITY lol 'lol'>"
                  "<!ENTITY lol2 '&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;'>"
                  "<!ENTITY lol3 '&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;'>]>"
                  "<iq xmlns='jabber:client' type='get' id='x'>&lol3;</iq>")
EXTERNAL = ("<!DOCTYPE iq [<!ENTITY x SYSTEM 'file:///etc/passwd'>]>"
            "<iq xmlns='jabber:client' type='get' id='x'>&x;</iq>")


@pytest.fixture(scope="module")
def xmpp(tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-fuzz")
    extra = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_PBKDF2_ITERATIONS": "4096",
             "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "100000"}
    with fresh_listener("postgres", base, extra, setup=SETUP) as broker, \
            daphne(broker.env, base) as url:
        yield broker, url


def mutate(frame: str, rng: random.Random) -> str:
    """One random damage to a frame."""
    op = rng.randrange(9)
    n = len(frame)
    i, j = sorted((rng.randrange(n + 1), rng.randrange(n + 1)))
    if op == 0:
        return frame[:i] + frame[j:]  # a span deleted
    if op == 1:
        return frame[:i] + rng.choice("<>&;'\"/=!?[]") + frame[i:]
    if op == 2:
        return frame[:i]  # truncated
    if op == 3:
        return frame[:i] + frame[i:j] * rng.randrange(2, 4) + frame[j:]
    if op == 4:
        return frame.replace("xmlns='", "xmlns='urn:wrong:" if rng.random() < 0.5
                             else "xmlns='x", 1)
    if op == 5:
        return f"<?php {frame}?>" if rng.random() < 0.5 else frame[:i] + "<?pi x?>" + frame[i:]
    if op == 6:
        return frame[:i] + "<!-- c -->" + frame[i:]
    if op == 7:
        return frame[:i] + "&bogus;" + frame[i:]
    return frame[:i] + chr(rng.choice([0x1, 0xb, 0xfffe, 0x7f, 0xe9, 0x1f600])) + frame[j:]


def pre_auth_frame(k: int, rng: random.Random) -> str | bytes:
    """Frames for a stream that has just been opened (or not even that)."""
    kind = k % 10
    if kind == 0:
        return BILLION_LAUGHS if rng.random() < 0.7 else EXTERNAL
    if kind == 1 and k % 200 == 1:  # huge frames, a few (each is 300 KiB on the wire)
        return "<iq xmlns='jabber:client' type='get' id='h'>" + "a" * 300_000 + "</iq>"
    if kind == 2:  # stanzas before auth
        return rng.choice([
            f"<iq xmlns='{CLIENT}' type='get' id='a' to='pubsub.localhost'>"
            f"<pubsub xmlns='{PUBSUB}'><items node='/x'/></pubsub></iq>",
            f"<message xmlns='{CLIENT}' to='bob@localhost'><body>hi</body></message>",
            f"<presence xmlns='{CLIENT}'/>"])
    if kind == 3:
        return rng.choice([f"<open xmlns='{FRAMING}' to='evil.example' version='1.0'/>",
                           "<stream:stream xmlns:stream='http://etherx.jabber.org/streams'/>",
                           "<iq xmlns='urn:wrong' type='get' id='w'/>", "<foo/>"])
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))  # binary junk
    seeds = ["<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>AGJvYgBwdw==</auth>",
             f"<iq xmlns='{CLIENT}' type='set' id='b'><bind xmlns='urn:ietf:params:xml:ns:"
             "xmpp-bind'><resource>r</resource></bind></iq>",
             f"<open xmlns='{FRAMING}' to='localhost' version='1.0'/>"]
    return mutate(rng.choice(seeds), rng)


def stanza_frame(k: int, rng: random.Random, node: str) -> tuple[str, str, bool]:
    """(frame, iq id, a publish that may store) for an authenticated stream: well-formed
    IQs that the server must answer one by one."""
    iq_id = f"f{k}"
    wrong = rng.choice(["/nowhere", "/x/*", "", "relative", "/x/" + "n" * 300, node,
                        "/closed", "/x/\u00e9t\u00e9", node + "/child"])
    bodies = [
        f"<pubsub xmlns='{PUBSUB}'><items node='{wrong}'/></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><items node='{node}' "
        f"max_items='{rng.choice(['-1', 'x', '0', '99999999999999999999'])}'/></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><subscribe node='{wrong}' jid='someone@else'/></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><retract node='{wrong}'><item id='{k}'/></retract></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><retract node='{node}'><item/></retract></pubsub>",
        f"<unlock xmlns='urn:xmpp:pubsub:queueing:0' node='{wrong}'><item id='1'/></unlock>",
        f"<pubsub xmlns='{PUBSUB}#owner'><delete node='{wrong}'/></pubsub>",
        f"<pubsub xmlns='{PUBSUB}#owner'><configure node='{node}'><x xmlns='jabber:x:data' "
        f"type='submit'><field var='pubsub#queueing'><value>maybe</value></field></x>"
        "</configure></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><create node='{wrong}'/></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><publish node='{wrong}'><item><p xmlns='urn:p'/></item>"
        "</publish></pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><publish node='{node}'><item><a/><b/></item></publish>"
        "</pubsub>",
        f"<pubsub xmlns='{PUBSUB}'><bogus/></pubsub>",
        "<query xmlns='urn:unknown:thing'/>",
        f"<pubsub xmlns='{PUBSUB}'/>",
        selector_subscribe(rng, rng.choice([node, wrong])),
    ]
    body = rng.choice(bodies)
    kind = rng.choice(["get", "set"])
    stores = "<publish " in body and f"node='{node}'" in body and "<a/><b/>" not in body
    if rng.random() < 0.25:
        # Attribute-level damage that keeps the frame well-formed.
        body = body.replace("node=", "nod=", 1) if rng.random() < 0.5 else body
        kind = rng.choice(["get", "set", "bogus", ""])
    if rng.random() < 0.1:
        # A publish that stores: counted against what the store holds at the end.
        body = (f"<pubsub xmlns='{PUBSUB}'><publish node='{node}'><item id='z{k}'>"
                f"<z xmlns='urn:z'>{k}</z></item></publish></pubsub>")
        kind, stores = "set", True
    frame = (f"<iq xmlns='{CLIENT}' type='{kind}' id='{iq_id}' to='pubsub.localhost'>"
             f"{body}</iq>")
    return frame, iq_id, stores and kind == "set"


SELECTOR_PIECES = ["(", ")", "=", "<", ">", "&", "|", "!", "*", "'", "%", "_", " ", "X_N",
                   "x-n", "AND", "OR", "NOT", "LIKE", "IN", "BETWEEN", "IS NULL", "\\", "1",
                   "2.5e3", "\u00e9", "\x00"]


def selector_subscribe(rng: random.Random, node: str) -> str:
    """A subscribe of this stream's own JID with a damaged ``pubsub#selector`` and
    ``pubsub#expire`` (the XMPP door's selector and lease options)."""
    text = "".join(rng.choice(SELECTOR_PIECES) for _ in range(rng.randint(0, 30)))
    text = text.replace("\x00", "")  # not a character XML may carry at all
    selector = rng.choice(["JMS", "LDAP", "RFC-2254", "XPATH", "jms", ""]) + " " + text
    # A damaged expire is refused before the selector is looked at: only now and then.
    expire = rng.choice(["1", "0", "-1", "tomorrow", "2999-01-01T00:00:00Z",
                         "1970-01-01T00:00:00Z", "99999999999999999999", "\u00b2"]
                        ) if rng.random() < 0.3 else ""
    fields = f"<field var='pubsub#selector'><value>{escape(selector)}</value></field>"
    if expire:
        fields += f"<field var='pubsub#expire'><value>{expire}</value></field>"
    return (f"<pubsub xmlns='{PUBSUB}'><subscribe node='{node}' jid='bob@localhost'/>"
            f"<options node='{node}' jid='bob@localhost'><x xmlns='jabber:x:data' "
            f"type='submit'>{fields}</x></options></pubsub>")


def one_pre_auth(url: str, frame: str | bytes) -> str:
    """Send ``frame`` on a new, opened stream: what the server answered."""
    s = XmppSession(url, timeout=60)
    try:
        if not (isinstance(frame, str) and frame.startswith("<open")):
            s.open()  # an <open/> itself is the stream's first frame
        if isinstance(frame, bytes):
            s.ws.send_binary(frame)
        else:
            s.send(frame)
        try:
            element = s.next_frame(timeout=60)
        except StreamEnded:
            return "closed-without-error"
        if element.tag == "{http://etherx.jabber.org/streams}error":
            condition = next(c.tag.split("}")[1] for c in element
                             if c.tag.startswith("{" + STREAMS))
            assert s.closed(60), "stream error without a close"
            return condition
        return "answered:" + element.tag
    finally:
        s.close()


def wait_item(s: XmppSession, node: str, item_id: str) -> None:
    """The notification of ``item_id`` (the fuzzed publishes' come in between)."""
    while s.event("item", node=node, timeout=60)[1].get("id") != item_id:
        pass


def test_ten_thousand_mutated_frames(xmpp):
    broker, url = xmpp
    rng = random.Random(SEED)
    owner = session(url, "alice")
    node = f"/x/fuzz{uuid.uuid4().hex[:6]}"
    create(owner, node)
    # A bystander subscribed all along: it keeps getting its notifications.
    bystander = session(url, "jtegen")
    ok(subscribe(bystander, node))

    frames = [pre_auth_frame(k, rng) for k in range(PRE_AUTH_FRAMES)]
    outcomes: dict[str, int] = {}
    examples: dict[str, str] = {}
    lock = threading.Lock()

    def run(frame: str | bytes) -> None:
        outcome = one_pre_auth(url, frame)
        with lock:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            examples.setdefault(outcome, repr(frame)[:300])

    # The owner and the bystander wait idle meanwhile (a minute or more on a loaded
    # machine): they answer Daphne's pings, as a client's event loop would.
    with ThreadPoolExecutor(4) as pool:
        runs = {pool.submit(run, frame) for frame in frames}
        while runs:
            done, runs = wait(runs, timeout=5)
            for future in done:
                future.result()
            owner.keepalive()
            bystander.keepalive()
    bad = {k: v for k, v in outcomes.items()
           if k not in STREAM_ERRORS and not k.startswith("answered:")}
    assert not bad, (outcomes, {k: examples[k] for k in bad})
    for needed in ("not-well-formed", "restricted-xml", "policy-violation", "not-authorized",
                   "invalid-namespace", "host-unknown"):
        assert outcomes.get(needed), (needed, outcomes)

    # Authenticated streams: every IQ gets its answer, the stream stays up.
    stored = 0
    selector_outcomes: dict[str, int] = {}
    streams = [session(url, "bob", resource=f"fz{i}") for i in range(3)]
    for k in range(STANZA_FRAMES):
        s = streams[k % 3]
        frame, iq_id, stores = stanza_frame(k, rng, node)
        s.send(frame)
        reply = s.reply(iq_id, timeout=60)
        assert reply.get("type") in ("result", "error"), ET.tostring(reply, "unicode")
        if stores and reply.get("type") == "result":
            stored += 1
        if "pubsub#selector" in frame and f"node='{node}'" in frame:
            text = "".join(reply.itertext())
            outcome = ("accepted" if reply.get("type") == "result" else
                       "566" if "566 " in text else "567" if "567 " in text else "other")
            selector_outcomes[outcome] = selector_outcomes.get(outcome, 0) + 1
        if k % 100 == 0:
            owner.keepalive()
            bystander.keepalive()
        if k % 500 == 0:  # the bystander is served meanwhile
            publish(owner, node, f"<tick xmlns='urn:t'>{k}</tick>", f"tick{k}")
            stored += 1
            wait_item(bystander, node, f"tick{k}")
    for s in streams:
        s.close()
    # The selector options were refused for both reasons, and taken when well-formed.
    assert selector_outcomes.get("566") and selector_outcomes.get("567"), selector_outcomes
    assert selector_outcomes.get("accepted"), selector_outcomes

    # Nothing partial: the node holds exactly the publishes answered with a result.
    rows = store_rows(broker.env, (
        "SELECT count(*) FROM broker_message m JOIN topics_topic t ON t.id = m.topic_id "
        f"WHERE t.path = '{node}'"))
    assert rows[0][0] == stored
    # Still serving: a fresh login, a publish, its notification.
    after = session(url, "bob", resource="after")
    publish(owner, node, "<done xmlns='urn:t'/>", "done")
    wait_item(bystander, node, "done")
    after.close()
    owner.close()
    bystander.close()
    log = url_log[url].read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "XMPP frame failed" not in log and "failed for" not in log
    with pytest.raises(websocket.WebSocketException):
        websocket.create_connection(url.replace("xmpp-websocket", "nope"), timeout=scaled(10),
                                    subprotocols=["xmpp"]).recv()
    assert broker.alive()
