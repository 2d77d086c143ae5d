"""Issue 23: the XMPP door over a real WebSocket against a real Daphne (as ``runbroker``
serves it), beside a real ``runsmqp`` on the same database: stream set-up and SASL, pubsub
on fan-out nodes (notifications with payloads, items, retract, offline backlog), both
directions across doors, and XEP-0254 queue nodes.
"""

from __future__ import annotations

import base64
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
import websocket

from tests.conftest import BrokerProcess, query_database
from tests.support.smqp_session import Session as SmqpSession
from tests.support.smqp_session import smuid_of
from tests.support.timing import scaled, wait_until
from tests.support.xmpp_session import (
    CLIENT,
    EVENT,
    FRAMING,
    PUBSUB,
    QUEUEING,
    SASL,
    XmppSession,
    error_condition,
    stream_error_condition,
    tag,
    xmpp_stack,
)

pytestmark = pytest.mark.e2e

DISCO_INFO = "http://jabber.org/protocol/disco#info"
DISCO_ITEMS = "http://jabber.org/protocol/disco#items"
PUBSUB_ERRORS = "http://jabber.org/protocol/pubsub#errors"

SETUP = """
from accounts.models import Account
from broker.services import topics as ts
from ual.models import Right, UALEntry
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
ts.create_topic(snap, '/x')
ts.create_topic(snap, '/closed')
x = ts.find('/x')
UALEntry.objects.create(topic=x, principal_kind='account',
                        account=Account.objects.get(username='alice'), right='manage')
for right in ('publish', 'subscribe'):
    UALEntry.objects.create(topic=x, principal_kind='everyone', right=right)
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def xmpp(request, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp")
    with xmpp_stack(request.param, base, SETUP) as stack:
        yield stack


def node() -> str:
    return f"/x/n{uuid.uuid4().hex[:8]}"


def session(url: str, user: str = "bob", **kw) -> XmppSession:
    s = XmppSession(url)
    s.login(user, **kw)
    return s


def ok(reply: ET.Element) -> ET.Element:
    assert reply.get("type") == "result", ET.tostring(reply, "unicode")
    return reply


def create(s: XmppSession, path: str, queue: bool = False, retry: int | None = None,
           max_retries: int | None = None) -> None:
    fields = ""
    if queue:
        fields += "<field var='pubsub#queueing'><value>1</value></field>"
    if retry is not None:
        fields += f"<field var='smqp#retry_timeout'><value>{retry}</value></field>"
    if max_retries is not None:
        fields += f"<field var='smqp#max_retries'><value>{max_retries}</value></field>"
    form = (f"<configure><x xmlns='jabber:x:data' type='submit'>{fields}</x></configure>"
            if fields else "")
    ok(s.pubsub("set", f"<create node='{path}'/>{form}"))


def publish(s: XmppSession, path: str, payload: str, item_id: str | None = None) -> str:
    id_attr = f" id='{item_id}'" if item_id else ""
    reply = ok(s.pubsub("set", f"<publish node='{path}'><item{id_attr}>{payload}</item>"
                               "</publish>"))
    return reply.find(f"{tag(PUBSUB, 'pubsub')}/{tag(PUBSUB, 'publish')}/"
                      f"{tag(PUBSUB, 'item')}").get("id")


def subscribe(s: XmppSession, path: str, queue_requests: int | None = None) -> ET.Element:
    options = ""
    if queue_requests is not None:
        options = (f"<options node='{path}' jid='{s.jid.split('/')[0]}'>"
                   "<x xmlns='jabber:x:data' type='submit'>"
                   "<field var='FORM_TYPE' type='hidden'><value>"
                   "http://jabber.org/protocol/pubsub#subscribe_options</value></field>"
                   f"<field var='pubsub#queue_requests'><value>{queue_requests}</value>"
                   "</field></x></options>")
    return s.pubsub("set", f"<subscribe node='{path}' jid='{s.jid.split('/')[0]}'/>{options}")


def payload_of(item: ET.Element) -> ET.Element:
    return next(iter(item))


# ------------------------------------------------------------------ transport and stream


def test_handshake_without_the_xmpp_subprotocol_is_refused(xmpp):
    _, url = xmpp
    with pytest.raises(websocket.WebSocketException):
        ws = websocket.create_connection(url, timeout=scaled(20))
        ws.send(f"<open xmlns='{FRAMING}' to='localhost' version='1.0'/>")
        ws.recv()


def test_open_to_another_domain_gets_host_unknown(xmpp):
    _, url = xmpp
    s = XmppSession(url)
    s.send(f"<open xmlns='{FRAMING}' to='example.org' version='1.0'/>")
    assert stream_error_condition(s) == "host-unknown"
    assert s.closed()


def test_features_offer_scram_and_plain_on_loopback(xmpp):
    _, url = xmpp
    s = XmppSession(url)
    features = s.open()
    mechs = [m.text for m in features.iter(tag(SASL, "mechanism"))]
    assert mechs == ["SCRAM-SHA-256", "PLAIN"]
    s.close()


def test_stanza_before_auth_is_not_authorized(xmpp):
    _, url = xmpp
    s = XmppSession(url)
    s.open()
    s.send(f"<iq xmlns='{CLIENT}' type='get' id='a' to='pubsub.localhost'>"
           f"<pubsub xmlns='{PUBSUB}'><items node='/x'/></pubsub></iq>")
    assert stream_error_condition(s) == "not-authorized"
    assert s.closed()


def test_wrong_password_fails_and_scram_logs_in(xmpp):
    _, url = xmpp
    s = XmppSession(url)
    s.open()
    assert s.auth_plain("bob", "wrong").tag == tag(SASL, "failure")
    assert s.auth_scram("bob", "wrong").tag == tag(SASL, "failure")
    assert s.auth_scram("bob", "pw").tag == tag(SASL, "success")
    s.open()
    reply = s.iq("set", "<bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><resource>w1"
                        "</resource></bind>", to=None)
    assert ok(reply).find(".//{urn:ietf:params:xml:ns:xmpp-bind}jid").text == \
        "bob@localhost/w1"
    ok(s.iq("set", "<session xmlns='urn:ietf:params:xml:ns:xmpp-session'/>", to=None))
    s.close()


def test_bind_is_a_login_session_that_ends_with_the_stream(xmpp):
    broker, url = xmpp
    s = session(url, "jtegen", resource="admin-view")
    live = """SELECT COUNT(*) FROM accounts_loginsession s
              JOIN accounts_account a ON a.id = s.account_id
              WHERE a.username = 'jtegen' AND s.ended IS NULL AND s.auth_method LIKE 'xmpp:%%'"""
    assert query_database(broker.env, live) == [(1,)]
    s.send(f"<close xmlns='{FRAMING}'/>")
    assert s.expect(lambda e: e.tag == tag(FRAMING, "close")) is not None
    assert s.closed()
    wait_until(lambda: query_database(broker.env, live) == [(0,)], 30, interval=0.2,
               message="the stream's login session ended")


# ------------------------------------------------------------------ fan-out nodes


def test_publish_subscribe_notification_items_and_retract(xmpp):
    _, url = xmpp
    pub, sub = session(url, "alice"), session(url, "bob")
    path = node()
    create(pub, path)
    ok(subscribe(sub, path))
    item_id = publish(pub, path, "<job xmlns='urn:test'><n>1</n></job>", "first")
    assert item_id == "first"
    got_node, item = sub.event("item", node=path)
    assert got_node == path and item.get("id") == "first"
    job = payload_of(item)
    assert job.tag == "{urn:test}job" and job.find("{urn:test}n").text == "1"
    auto = publish(pub, path, "<job xmlns='urn:test'><n>2</n></job>")
    assert auto.isdigit()
    assert sub.event("item", node=path)[1].get("id") == auto
    # items: both, oldest first; max_items=1: the latest
    items = ok(sub.pubsub("get", f"<items node='{path}'/>")).findall(f".//{tag(PUBSUB, 'item')}")
    assert [i.get("id") for i in items] == ["first", auto]
    latest = ok(sub.pubsub("get", f"<items node='{path}' max_items='1'/>"))
    assert [i.get("id") for i in latest.findall(f".//{tag(PUBSUB, 'item')}")] == [auto]
    # publishing an id again replaces the item
    publish(pub, path, "<job xmlns='urn:test'><n>3</n></job>", "first")
    items = ok(sub.pubsub("get", f"<items node='{path}'/>")).findall(f".//{tag(PUBSUB, 'item')}")
    assert sorted(i.get("id") for i in items) == sorted(["first", auto])
    first = next(i for i in items if i.get("id") == "first")
    assert payload_of(first).find("{urn:test}n").text == "3"
    # retract by the publisher: subscribers get the retract notification
    ok(pub.pubsub("set", f"<retract node='{path}' notify='true'><item id='{auto}'/></retract>"))
    assert sub.event("retract", node=path)[1].get("id") == auto
    # by someone else (no manage right, not the publisher): forbidden
    reply = sub.pubsub("set", f"<retract node='{path}'><item id='first'/></retract>")
    assert error_condition(reply) == "forbidden"
    reply = sub.pubsub("set", f"<retract node='{path}'><item id='nope'/></retract>")
    assert error_condition(reply) == "item-not-found"
    pub.close()
    sub.close()


def test_errors_of_unknown_nodes_and_rights(xmpp):
    _, url = xmpp
    s = session(url, "bob")
    assert error_condition(s.pubsub("get", "<items node='/nowhere'/>")) == "item-not-found"
    assert error_condition(s.pubsub("set", "<publish node='/nowhere'><item/></publish>")) \
        == "item-not-found"
    assert error_condition(s.pubsub("set", "<create node='/x'/>")) == "conflict"
    # /closed is hidden from bob: below it is answered as below a missing node (issue 34)
    assert error_condition(s.pubsub("set", "<create node='/closed/sub'/>")) == "item-not-found"
    reply = s.pubsub("set", "<purge node='/x'/>", owner=True)
    assert error_condition(reply) == "feature-not-implemented"
    s.close()


def test_offline_subscriber_gets_the_backlog_on_bind(xmpp):
    _, url = xmpp
    pub, sub = session(url, "alice"), session(url, "jtegen", resource="r1")
    path = node()
    create(pub, path)
    ok(subscribe(sub, path))
    sub.close()
    ids = [publish(pub, path, f"<n xmlns='urn:test'>{i}</n>") for i in range(5)]
    sub = session(url, "jtegen", resource="r2")
    got = [sub.event("item", node=path)[1] for _ in ids]
    assert [i.get("id") for i in got] == ids
    assert [payload_of(i).text for i in got] == [str(i) for i in range(5)]
    pub.close()
    sub.close()


def test_disco(xmpp):
    _, url = xmpp
    s = session(url, "bob")
    info = ok(s.iq("get", f"<query xmlns='{DISCO_INFO}'/>"))
    features = {f.get("var") for f in info.iter(tag(DISCO_INFO, "feature"))}
    assert {PUBSUB, PUBSUB + "#publish", QUEUEING, PUBSUB + "#config-node"} <= features
    items = ok(s.iq("get", f"<query xmlns='{DISCO_ITEMS}' node='/'/>"))
    nodes = {i.get("node") for i in items.iter(tag(DISCO_ITEMS, "item"))}
    assert "/x" in nodes
    s.close()


def test_disco_of_the_server_and_of_a_node(xmpp):
    _, url = xmpp
    owner, s = session(url, "alice"), session(url, "bob")
    fanout, queue = node(), node()
    create(owner, fanout)
    create(owner, queue, queue=True)
    # The server itself (no 'to', or its domain) is an im server, not the pubsub service.
    for to in (None, "localhost"):
        server = ok(s.iq("get", f"<query xmlns='{DISCO_INFO}'/>", to=to))
        assert {(i.get("category"), i.get("type"))
                for i in server.iter(tag(DISCO_INFO, "identity"))} == {("server", "im")}
        items = ok(s.iq("get", f"<query xmlns='{DISCO_ITEMS}'/>", to=to))
        assert [i.get("jid") for i in items.iter(tag(DISCO_ITEMS, "item"))] \
            == ["pubsub.localhost"]

    def node_info(path: str) -> tuple[set, set]:
        info = ok(s.iq("get", f"<query xmlns='{DISCO_INFO}' node='{path}'/>"))
        return ({(i.get("category"), i.get("type"), i.get("name"))
                 for i in info.iter(tag(DISCO_INFO, "identity"))},
                {f.get("var") for f in info.iter(tag(DISCO_INFO, "feature"))})

    # A node is a pubsub leaf; XEP-0254's feature is announced on queue nodes only.
    identities, features = node_info(queue)
    assert identities == {("pubsub", "leaf", queue)} and QUEUEING in features
    identities, features = node_info(fanout)
    assert identities == {("pubsub", "leaf", fanout)}
    assert PUBSUB in features and QUEUEING not in features
    # A hidden node answers as a missing one.
    for hidden in ("/closed", "/nowhere"):
        reply = s.iq("get", f"<query xmlns='{DISCO_INFO}' node='{hidden}'/>")
        assert error_condition(reply) == "item-not-found", hidden
    owner.close()
    s.close()


def test_unsubscribe(xmpp):
    _, url = xmpp
    pub, sub = session(url, "alice"), session(url, "bob")
    path, witness = node(), node()
    create(pub, path)
    create(pub, witness)
    bare = sub.jid.split("/")[0]
    ok(subscribe(sub, path))
    ok(subscribe(sub, witness))
    publish(pub, path, "<n xmlns='urn:test'>1</n>", "before")
    assert sub.event("item", node=path)[1].get("id") == "before"
    # Only one's own JID; a node that is missing or hidden answers as missing.
    reply = sub.pubsub("set", f"<unsubscribe node='{path}' jid='alice@localhost'/>")
    assert error_condition(reply) == "bad-request"
    assert reply.find(".//" + tag(PUBSUB_ERRORS, "invalid-jid")) is not None
    for hidden in ("/closed", "/nowhere"):
        reply = sub.pubsub("set", f"<unsubscribe node='{hidden}' jid='{bare}'/>")
        assert error_condition(reply) == "item-not-found", hidden
    ok(sub.pubsub("set", f"<unsubscribe node='{path}' jid='{bare}'/>"))
    # XEP-0060 6.2.3.2: not subscribed (any more).
    reply = sub.pubsub("set", f"<unsubscribe node='{path}' jid='{bare}'/>")
    assert error_condition(reply) == "unexpected-request"
    assert reply.find(".//" + tag(PUBSUB_ERRORS, "not-subscribed")) is not None
    # Nothing published after it arrives, on this stream or on the account's next one; the
    # item on the node still subscribed, published after it, does.
    publish(pub, path, "<n xmlns='urn:test'>2</n>", "after")
    publish(pub, witness, "<n xmlns='urn:test'>3</n>", "witness")
    assert sub.event("item", node=witness)[1].get("id") == "witness"
    with pytest.raises(AssertionError, match="no item event"):
        sub.event("item", node=path, timeout=1)
    sub.close()
    again = session(url, "bob")
    publish(pub, witness, "<n xmlns='urn:test'>4</n>", "witness-2")
    assert again.event("item", node=witness)[1].get("id") == "witness-2"
    with pytest.raises(AssertionError, match="no item event"):
        again.event("item", node=path, timeout=1)
    pub.close()
    again.close()


def test_configure_a_node(xmpp):
    _, url = xmpp
    owner, other = session(url, "alice"), session(url, "bob")
    path = node()
    create(owner, path)

    def config() -> dict[str, str | None]:
        reply = ok(owner.pubsub("get", f"<configure node='{path}'/>", owner=True))
        return {f.get("var"): f.findtext("{jabber:x:data}value")
                for f in reply.iter("{jabber:x:data}field")}

    def configure(s: XmppSession, fields: str) -> ET.Element:
        return s.pubsub("set", f"<configure node='{path}'><x xmlns='jabber:x:data' "
                               f"type='submit'>{fields}</x></configure>", owner=True)

    assert config()["pubsub#queueing"] == "0"
    ok(configure(owner, "<field var='pubsub#queueing'><value>true</value></field>"
                        "<field var='smqp#retry_timeout'><value>45</value></field>"))
    after = config()
    assert after["pubsub#queueing"] == "1" and after["smqp#retry_timeout"] == "45"
    # A bad value or an unknown field: not-acceptable, and nothing changes.
    for bad in ("<field var='pubsub#queueing'><value>maybe</value></field>",
                "<field var='smqp#retry_timeout'><value>-3</value></field>"
                "<field var='pubsub#queueing'><value>0</value></field>",
                "<field var='pubsub#no_such_thing'><value>1</value></field>"):
        assert error_condition(configure(owner, bad)) == "not-acceptable", bad
    assert config() == after
    # The manage right is needed, to read as to change.
    assert error_condition(configure(other, "<field var='pubsub#queueing'><value>0</value>"
                                            "</field>")) == "forbidden"
    assert error_condition(other.pubsub("get", f"<configure node='{path}'/>", owner=True)) \
        == "forbidden"
    assert config() == after
    owner.close()
    other.close()


def test_item_ids_on_publish_and_retrieval(xmpp):
    _, url = xmpp
    s = session(url, "alice")
    path = node()
    create(s, path)
    reply = s.pubsub("set", f"<publish node='{path}'><item id='{'i' * 181}'>"
                            "<n xmlns='urn:test'/></item></publish>")
    assert error_condition(reply) == "not-acceptable"
    longest = "i" * 180
    assert publish(s, path, "<n xmlns='urn:test'>1</n>", longest) == longest
    publish(s, path, "<n xmlns='urn:test'>2</n>", "two")
    got = ok(s.pubsub("get", f"<items node='{path}'><item id='two'/></items>"))
    assert [i.get("id") for i in got.iter(tag(PUBSUB, "item"))] == ["two"]
    reply = s.pubsub("get", f"<items node='{path}'><item id='missing'/></items>")
    assert error_condition(reply) == "item-not-found"
    s.close()


# ------------------------------------------------------------------ across doors


def test_xmpp_publish_reaches_smqp_and_smqp_publish_reaches_xmpp(xmpp):
    broker, url = xmpp
    path = node()
    x = session(url, "bob")
    create(session(url, "alice"), path)
    ok(subscribe(x, path))
    with SmqpSession(broker.host, broker.port, "alice") as smqp:
        assert smqp.command(f"SUB MESSAGE {path}").code == 200
        publish(x, path, "<hello xmlns='urn:test'>world</hello>", "h1")
        msg = smqp.message(timeout=30)
        section = msg.message.sections[0]
        assert section.get("Content-Type") == "application/xml"
        assert ET.fromstring(section.body).tag == "{urn:test}hello"
        smqp.ack()
        smuid = smuid_of(smqp.publish(path, "c1", [("Name", "report")],
                                      [("text/plain", b"plain body"),
                                       ("application/xml", b"<a xmlns='urn:a'>1</a>")]))
    x.event("item", node=path)  # its own publish first
    _, item = x.event("item", node=path)
    assert item.get("id") == str(smuid)
    message = payload_of(item)
    assert message.tag == "{urn:smqp:message:0}message"
    headers = {h.get("name"): h.text for h in message.findall("{urn:smqp:message:0}header")}
    assert headers["Name"] == "report"
    sections = message.findall("{urn:smqp:message:0}section")
    assert sections[0].get("encoding") == "base64"
    assert base64.b64decode(sections[0].text) == b"plain body"
    assert next(iter(sections[1])).tag == "{urn:a}a"
    x.close()


# ------------------------------------------------------------------ queue nodes


def test_queue_subscribe_needs_queue_requests(xmpp):
    _, url = xmpp
    s = session(url, "alice")
    path = node()
    create(s, path, queue=True)
    reply = subscribe(s, path)
    assert error_condition(reply) == "not-acceptable"
    assert reply.find(".//" + tag(PUBSUB_ERRORS, "configuration-required")) \
        is not None
    fields = [f.get("var") for f in reply.iter("{jabber:x:data}field")]
    assert "pubsub#queue_requests" in fields
    reply = ok(subscribe(s, path, 3))
    values = [v.text for v in reply.iter("{jabber:x:data}value")]
    assert "3" in values
    config = ok(s.pubsub("get", f"<configure node='{path}'/>", owner=True))
    queueing = next(f for f in config.iter("{jabber:x:data}field")
                if f.get("var") == "pubsub#queueing")
    assert queueing.find("{jabber:x:data}value").text == "1"
    s.close()


def test_queue_locks_retract_unlock_and_errors(xmpp):
    _, url = xmpp
    pub = session(url, "alice")
    w1 = session(url, "bob", resource="w1")
    w2 = session(url, "bob", resource="w2")
    path = node()
    create(pub, path, queue=True, retry=300)
    ok(subscribe(w1, path, 2))
    ok(subscribe(w2, path, 1))
    ids = [publish(pub, path, f"<job xmlns='urn:q'>{i}</job>", f"j{i}") for i in range(3)]
    # 3 items, 2 + 1 slots: each worker fills its slots, nothing more
    got1 = [w1.event("item", node=path)[1].get("id") for _ in range(2)]
    got2 = [w2.event("item", node=path)[1].get("id")]
    assert sorted(got1 + got2) == ids
    # w2 retracts an item w1 holds: conflict; an unknown one: item-not-found
    reply = w2.pubsub("set", f"<retract node='{path}'><item id='{got1[0]}'/></retract>")
    assert error_condition(reply) == "conflict"
    reply = w2.pubsub("set", f"<retract node='{path}'><item id='zzz'/></retract>")
    assert error_condition(reply) == "item-not-found"
    # w1 consumes its first: result, and the retract notification to w1 only
    ok(w1.pubsub("set", f"<retract node='{path}'><item id='{got1[0]}'/></retract>"))
    assert w1.event("retract", node=path)[1].get("id") == got1[0]
    # consuming it again: it is gone
    reply = w1.pubsub("set", f"<retract node='{path}'><item id='{got1[0]}'/></retract>")
    assert error_condition(reply) == "item-not-found"
    # w2 unlocks its item: the unlock notification, and the item goes to w1's free slot
    unlock = (f"<unlock xmlns='{QUEUEING}' node='{path}'><item id='{got2[0]}'/></unlock>")
    ok(w2.iq("set", unlock))
    assert w2.event("unlock", node=path)[1].get("id") == got2[0]
    assert w1.event("item", node=path)[1].get("id") == got2[0]
    # w2 no longer holds it, and w1 does now: conflict for w2
    reply = w2.iq("set", unlock)
    assert error_condition(reply) == "conflict"
    for item_id in (got1[1], got2[0]):
        ok(w1.pubsub("set", f"<retract node='{path}'><item id='{item_id}'/></retract>"))
    items = ok(pub.pubsub("get", f"<items node='{path}'/>")).findall(f".//{tag(PUBSUB, 'item')}")
    assert items == []
    for s in (pub, w1, w2):
        s.close()


def test_queue_lock_timeout_and_disconnect_hand_items_on(xmpp):
    _, url = xmpp
    pub = session(url, "alice")
    w1 = session(url, "bob", resource="slow")
    path = node()
    create(pub, path, queue=True, retry=2)
    ok(subscribe(w1, path, 1))
    publish(pub, path, "<job xmlns='urn:q'>t</job>", "t1")
    assert w1.event("item", node=path)[1].get("id") == "t1"
    # no retract within the retry timeout: the unlock notification to the holder
    assert w1.event("unlock", node=path, timeout=60)[1].get("id") == "t1"
    # the released item comes back (the only subscriber); retract after the timeout of
    # the first lock is refused if it is not held
    assert w1.event("item", node=path, timeout=60)[1].get("id") == "t1"
    w1.close()  # disconnect: the lock ends with the stream
    w2 = session(url, "bob", resource="fresh")
    ok(subscribe(w2, path, 1))
    assert w2.event("item", node=path, timeout=60)[1].get("id") == "t1"
    ok(w2.pubsub("set", f"<retract node='{path}'><item id='t1'/></retract>"))
    pub.close()
    w2.close()


def test_unavailable_presence_releases_locks(xmpp):
    _, url = xmpp
    pub = session(url, "alice")
    w1 = session(url, "bob", resource="p1")
    w2 = session(url, "bob", resource="p2")
    path = node()
    create(pub, path, queue=True, retry=300)
    ok(subscribe(w1, path, 1))
    publish(pub, path, "<job xmlns='urn:q'>p</job>", "p1")
    holder, other = (w1, w2)
    assert holder.event("item", node=path)[1].get("id") == "p1"
    ok(subscribe(other, path, 1))
    holder.send(f"<presence xmlns='{CLIENT}' type='unavailable'/>")
    assert other.event("item", node=path, timeout=60)[1].get("id") == "p1"
    ok(other.pubsub("set", f"<retract node='{path}'><item id='p1'/></retract>"))
    # the first holder may not consume it any more
    reply = holder.pubsub("set", f"<retract node='{path}'><item id='p1'/></retract>")
    assert error_condition(reply) == "item-not-found"
    for s in (pub, w1, w2):
        s.close()


def test_event_namespace_is_pubsub_event(xmpp):
    _, url = xmpp
    pub, sub = session(url, "alice"), session(url, "bob")
    path = node()
    create(pub, path)
    ok(subscribe(sub, path))
    # A payload in no namespace keeps none inside the event (xmlns=''); one written
    # without xmlns inside <pubsub> is in the pubsub namespace, and stays there.
    publish(pub, path, "<bare xmlns=''>no namespace</bare>")
    publish(pub, path, "<inherits/>")
    _, item = sub.event("item", node=path)
    assert item.tag == tag(EVENT, "item")
    assert payload_of(item).tag == "bare"
    assert payload_of(sub.event("item", node=path)[1]).tag == tag(PUBSUB, "inherits")
    pub.close()
    sub.close()


def test_queue_item_is_dead_after_max_retries(xmpp):
    """A worker that never answers: each lock times out (unlock notification) and the item
    comes back, until the topic's max retries are spent; then it is dead (Trash)."""
    broker, url = xmpp
    pub = session(url, "alice")
    w = session(url, "bob", resource="idle")
    path = node()
    create(pub, path, queue=True, retry=1, max_retries=1)
    ok(subscribe(w, path, 1))
    publish(pub, path, "<job xmlns='urn:q'>d</job>", "d1")
    for _ in range(2):  # the first attempt and one retry
        assert w.event("item", node=path, timeout=60)[1].get("id") == "d1"
        assert w.event("unlock", node=path, timeout=60)[1].get("id") == "d1"
    script = ("from broker.models import Delivery, Message\n"
              f"m = Message.objects.get(topic__path='{path}')\n"
              "print(Delivery.objects.get(message=m).state, m.state)")
    deadline = time.monotonic() + scaled(60)
    while True:
        states = broker.manage("shell", "--no-imports", "-c", script).stdout.split()
        if states and states[0] == "dead":
            break
        assert time.monotonic() < deadline, states
        time.sleep(scaled(1))
    reply = w.pubsub("set", f"<retract node='{path}'><item id='d1'/></retract>")
    assert error_condition(reply) == "item-not-found"
    pub.close()
    w.close()
