"""The XMPP door meets selectors, leases and the operators' console, over a real WebSocket
against a real Daphne beside a real ``runsmqp`` on the same database (both backends):

* subscribe option ``pubsub#selector`` (SMQP-PROFILE §9.2): an XMPP subscriber gets exactly
  the messages its selector matches of a mixed stream of 1,000 published over SMQP, beside an
  SMQP subscriber with another selector; a refused selector is an IQ error naming 566 / 567
  and the column, and the stream stays usable;
* subscribe option ``pubsub#expire`` (a lease, §9.3) and a revoked right end the
  subscription with XEP-0060's ``subscription='none'`` notification at every bound stream of
  the account, and nothing published afterwards is delivered;
* the console's "close session" ends an XMPP stream (stream error policy-violation), the
  console counts XMPP sessions as door ``xmpp``, and XMPP publishes and deliveries are in the
  operators' counters.
"""

from __future__ import annotations

import json
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from xml.sax.saxutils import escape

import pytest

from tests.conftest import BrokerProcess, fresh_listener
from tests.e2e.smqp.test_selectors import N, _expected, _headers
from tests.support.queue_clients import store_rows
from tests.support.smqp_session import Session as SmqpSession
from tests.support.smqp_session import header, smuid_of
from tests.support.timing import scaled
from tests.support.xmpp_session import (
    CLIENT,
    EVENT,
    PUBSUB,
    XmppSession,
    daphne,
    error_condition,
    stream_error_condition,
    tag,
)

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
from topics.models import Topic
snap = AccessSnapshot(Account.objects.get(username='root'))
for path in ['/sel', '/sel/mix', '/sel/lease', '/sel/errors', '/rev', '/rev/t', '/cnt']:
    ts.create_topic(snap, path)
sel = Topic.objects.get(path='/sel')
for name in ['bob', 'alice', 'jtegen']:
    a = Account.objects.get(username=name)
    UALEntry.objects.create(topic=sel, principal_kind='account', account=a, right='subscribe')
UALEntry.objects.create(topic=Topic.objects.get(path='/rev/t'), principal_kind='account',
                        account=Account.objects.get(username='alice'), right='subscribe')
cnt = Topic.objects.get(path='/cnt')
for right in ('publish', 'subscribe'):
    UALEntry.objects.create(topic=cnt, principal_kind='everyone', right=right)
UALEntry.objects.create(topic=cnt, principal_kind='account',
                        account=Account.objects.get(username='bob'), right='manage')
"""

SMQP_MESSAGE = "urn:smqp:message:0"
SUBSCRIPTION_REASON = "urn:smqp:subscription:0"
# The XMPP subscriber's and the SMQP subscriber's selectors (e2e/smqp/test_selectors' rules).
BOB = ("JMS", "X_Region = 'emea' AND X_N < 600")
ALICE = ("LDAP", "(&(x-region=apac)(|(priority<=1)(x-n>=900)))")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def xmpp(request, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-sel")
    extra = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "1000"}
    with fresh_listener(request.param, base, extra, setup=SETUP) as broker, \
            daphne(broker.env, base) as url:
        yield broker, url


def session(url: str, user: str) -> XmppSession:
    s = XmppSession(url, timeout=60)
    s.login(user)
    return s


def bare(s: XmppSession) -> str:
    return s.jid.split("/")[0]


def subscribe(s: XmppSession, path: str, **fields: str) -> ET.Element:
    """Subscribe with a subscribe-options form of ``fields`` (``selector`` →
    ``pubsub#selector``, ``expire`` → ``pubsub#expire``)."""
    form = "".join(f"<field var='pubsub#{k}'><value>{escape(v)}</value></field>"
                   for k, v in fields.items())
    options = ""
    if fields:
        options = (f"<options node='{path}' jid='{bare(s)}'>"
                   "<x xmlns='jabber:x:data' type='submit'>"
                   "<field var='FORM_TYPE' type='hidden'><value>"
                   f"{PUBSUB}#subscribe_options</value></field>{form}</x></options>")
    return s.pubsub("set", f"<subscribe node='{path}' jid='{bare(s)}'/>{options}")


def ok(reply: ET.Element) -> ET.Element:
    assert reply.get("type") == "result", ET.tostring(reply, "unicode")
    return reply


def x_n(item: ET.Element) -> int:
    message = next(iter(item))
    assert message.tag == f"{{{SMQP_MESSAGE}}}message"
    headers = {h.get("name"): h.text for h in message.findall(f"{{{SMQP_MESSAGE}}}header")}
    return int(headers["X-N"])


def no_item(s: XmppSession, wait: float) -> bool:
    """True when no item notification comes within ``wait`` seconds."""
    try:
        s.event("item", timeout=wait)
    except AssertionError:
        return True
    return False


def ended(s: XmppSession, timeout: float = 30.0) -> ET.Element:
    """The subscription state notification (XEP-0060 §7.1.3)."""
    def match(e: ET.Element) -> bool:
        return (e.tag == tag(CLIENT, "message")
                and e.find(f"{tag(EVENT, 'event')}/{tag(EVENT, 'subscription')}") is not None)

    message = s.expect(match, timeout, what="subscription notification")
    return message


def ended_fields(message: ET.Element) -> tuple[str, str, str, str]:
    sub = message.find(f"{tag(EVENT, 'event')}/{tag(EVENT, 'subscription')}")
    reason = message.find(tag(SUBSCRIPTION_REASON, "reason"))
    return (sub.get("node"), sub.get("jid"), sub.get("subscription"),
            reason.text if reason is not None else "")


def shell_json(broker: BrokerProcess, script: str) -> object:
    out = broker.manage("shell", "--no-imports", "-c", script).stdout
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ selectors


def test_xmpp_selector_beside_smqp_selector_on_a_mixed_stream_of_1000(xmpp):
    broker, url = xmpp
    bob = session(url, "bob")
    alice = SmqpSession(broker.host, broker.port, "alice")
    try:
        reply = ok(subscribe(bob, "/sel/mix", selector=f"{BOB[0]} {BOB[1]}"))
        sub = reply.find(f"{tag(PUBSUB, 'pubsub')}/{tag(PUBSUB, 'subscription')}")
        assert sub.get("subscription") == "subscribed"
        assert alice.command(f"SUB MESSAGE /sel/mix SELECTOR {ALICE[0]} {ALICE[1]}").code == 200
        with SmqpSession(broker.host, broker.port, "root") as pub:
            for i in range(N):  # pipelined: every publish on its way before the replies
                pub.send_publish("/sel/mix", f"M{i}", _headers(i))
            for _ in range(N):
                smuid_of(pub.reply())
        wanted = {i for i in range(N) if _expected("bob", i)}
        got = [x_n(bob.event("item", timeout=60, node="/sel/mix")[1]) for _ in wanted]
        assert sorted(got) == sorted(wanted)  # each once, nothing selected out
        assert no_item(bob, 2.0)  # and nothing else
        wanted_alice = {i for i in range(N) if _expected("alice", i)}
        got_alice = []
        while len(got_alice) < len(wanted_alice):
            note = alice.message(timeout=60)
            got_alice.append(int(header(note, "X-N")))
            alice.ack()
        assert sorted(got_alice) == sorted(wanted_alice)
        assert alice.quiet(1.0)
        # The store holds bob's deliveries for exactly the selected messages.
        rows = store_rows(broker.env, (
            "SELECT COUNT(*) FROM broker_delivery d JOIN accounts_account a ON "
            "a.id = d.account_id JOIN broker_message m ON m.id = d.message_id JOIN "
            "topics_topic t ON t.id = m.topic_id WHERE a.username = 'bob' AND "
            "t.path = '/sel/mix'"))
        assert rows[0][0] == len(wanted)
    finally:
        bob.close()
        alice.close()


@pytest.mark.parametrize(("selector", "code", "words"), [
    ("XPATH //a", "566", "Unsupported selector class"),
    ("JMS X_N = = 2", "567", "column"),
    ("LDAP (x-n=1", "567", "column"),
    ("JMS", None, "pubsub#selector"),
])
def test_a_refused_selector_is_an_iq_error_and_the_stream_goes_on(xmpp, selector, code,
                                                                  words):
    _, url = xmpp
    s = session(url, "jtegen")
    try:
        reply = subscribe(s, "/sel/errors", selector=selector)
        assert error_condition(reply) == "bad-request", ET.tostring(reply, "unicode")
        error = reply.find(tag(CLIENT, "error"))
        text = error.find("{urn:ietf:params:xml:ns:xmpp-stanzas}text").text or ""
        if code is not None:
            assert error.find(f"{{{PUBSUB}#errors}}invalid-options") is not None
            assert text.startswith(code + " "), text
        assert words in text, text
        # Nothing was recorded, and the stream answers on.
        ok(s.iq("get", "<ping xmlns='urn:xmpp:ping'/>", to=None))
        rows = store_rows(url_env(xmpp), (
            "SELECT COUNT(*) FROM broker_subscription s JOIN accounts_account a ON "
            "a.id = s.account_id WHERE a.username = 'jtegen' AND s.pattern = '/sel/errors'"))
        assert rows[0][0] == 0
    finally:
        s.close()


def url_env(xmpp: tuple[BrokerProcess, str]) -> dict[str, str]:
    return xmpp[0].env


def test_a_bad_expire_is_refused(xmpp):
    _, url = xmpp
    s = session(url, "jtegen")
    try:
        past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        for value in ("soon", past, "0"):
            reply = subscribe(s, "/sel/errors", expire=value)
            assert error_condition(reply) == "bad-request", value
    finally:
        s.close()


# ------------------------------------------------------------------ ends of subscriptions


def test_a_two_second_lease_ends_with_subscription_none_at_every_stream(xmpp):
    broker, url = xmpp
    bob = session(url, "bob")
    other = None
    try:
        started = time.monotonic()
        expire = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
        ok(subscribe(bob, "/sel/lease", expire=expire, selector="JMS X_N >= 0"))
        with SmqpSession(broker.host, broker.port, "root") as pub:
            smuid_of(pub.publish("/sel/lease", "before", _headers(1)))
            _, item = bob.event("item", timeout=30, node="/sel/lease")
            assert x_n(item) == 1
            other = session(url, "bob")  # a second bound stream of the account
            for s in (bob, other):
                assert ended_fields(ended(s)) == ("/sel/lease", bare(bob), "none", "lease")
            assert time.monotonic() - started >= 1.5  # the lease, not at once
            smuid_of(pub.publish("/sel/lease", "after", _headers(2)))
        assert no_item(bob, 2.0) and no_item(other, 0.5)
    finally:
        bob.close()
        if other is not None:
            other.close()


def test_a_revoked_right_ends_the_subscription_with_subscription_none(xmpp):
    broker, url = xmpp
    alice = session(url, "alice")
    try:
        ok(subscribe(alice, "/rev/t"))
        with SmqpSession(broker.host, broker.port, "root") as pub:
            smuid_of(pub.publish("/rev/t", "before", _headers(4)))
            assert x_n(alice.event("item", timeout=30, node="/rev/t")[1]) == 4
            broker.manage("shell", "--no-imports", "-c", (
                "from ual.models import UALEntry\n"
                "for e in UALEntry.objects.filter(topic__path='/rev/t', "
                "account__username='alice'):\n    e.delete()\n"))
            assert ended_fields(ended(alice)) == ("/rev/t", bare(alice), "none", "revoked")
            smuid_of(pub.publish("/rev/t", "after", _headers(5)))
        assert no_item(alice, 2.0)
    finally:
        alice.close()


# ------------------------------------------------------------------ console


SESSIONS = """
import json
from broker.services import stats
print(json.dumps({"live": stats.live_sessions(), "by_door": stats.sessions_by_door()},
                 default=str))
"""


def test_console_counts_xmpp_sessions_and_closes_one(xmpp):
    broker, url = xmpp
    first, second = session(url, "jtegen"), session(url, "jtegen")
    try:
        seen = shell_json(broker, SESSIONS)
        xmpp_live = [r for r in seen["live"] if r["account"] == "jtegen" and r["door"] == "xmpp"]
        assert len(xmpp_live) >= 2
        assert seen["by_door"].get("xmpp", 0) >= 2
        guids = shell_json(broker, (
            "import json\nfrom accounts.models import LoginSession\n"
            "print(json.dumps(list(LoginSession.objects.filter(account__username='jtegen', "
            "ended__isnull=True, auth_method__startswith='xmpp:').order_by('pk')"
            ".values_list('guid', flat=True))))"))
        target = guids[-1]  # the second stream's (bound last)
        assert shell_json(broker, (
            "import json\nfrom broker.services import stats\n"
            f"print(json.dumps(stats.close_session('{target}')))")) is True
        assert stream_error_condition(second, timeout=30) == "policy-violation"
        assert second.closed(timeout=30)
        # The first stream is untouched; the closed one's session has ended.
        ok(first.iq("get", "<ping xmlns='urn:xmpp:ping'/>", to=None))
        deadline = time.monotonic() + scaled(30)
        while True:
            rows = store_rows(broker.env, "SELECT ended FROM accounts_loginsession WHERE "
                              f"guid = '{target}'")
            if rows and rows[0][0] is not None:
                break
            assert time.monotonic() < deadline, "the closed session did not end"
            time.sleep(0.3)
    finally:
        first.close()
        second.close()


TOTALS = """
import json
from broker.services import stats
print(json.dumps(stats.message_totals()))
"""


def _settled_totals(broker: BrokerProcess) -> dict[str, int]:
    """The counters once nothing more arrives (two reads a few flushes apart agree)."""
    last = shell_json(broker, TOTALS)
    for _ in range(20):
        time.sleep(scaled(2.5))
        now = shell_json(broker, TOTALS)
        if now == last:
            return now
        last = now
    raise AssertionError("the counters did not settle")


def test_xmpp_publishes_and_deliveries_are_counted(xmpp):
    broker, url = xmpp
    path = f"/cnt/n{uuid.uuid4().hex[:8]}"
    publisher, reader = session(url, "bob"), session(url, "jtegen")
    try:
        ok(publisher.pubsub("set", f"<create node='{path}'/>"))
        ok(subscribe(reader, path))
        before = _settled_totals(broker)
        for i in range(3):
            ok(publisher.pubsub("set", f"<publish node='{path}'><item id='c{i}'>"
                                       f"<n xmlns='urn:t'>{i}</n></item></publish>"))
        for _ in range(3):
            reader.event("item", timeout=30, node=path)
        deadline = time.monotonic() + scaled(60)
        while True:
            after = shell_json(broker, TOTALS)
            grown = {k: after.get(k, 0) - before.get(k, 0) for k in ("publish", "deliver")}
            if grown == {"publish": 3, "deliver": 3}:
                break
            assert time.monotonic() < deadline, (before, after)
            assert grown["publish"] <= 3 and grown["deliver"] <= 3, (before, after)
            time.sleep(scaled(0.5))
    finally:
        publisher.close()
        reader.close()


def test_two_selectors_on_one_node_and_its_removal(xmpp):
    """Each selector is a subscription of its own (own subid; a message both match comes
    once); deleting the node ends both, each with subscription='none' (reason removed)."""
    _, url = xmpp
    path = f"/cnt/r{uuid.uuid4().hex[:8]}"
    owner, reader = session(url, "bob"), session(url, "jtegen")
    try:
        ok(owner.pubsub("set", f"<create node='{path}'/>"))
        subids = set()
        for selector in ("JMS X_N IS NULL", "LDAP (!(x-n=*))"):
            reply = ok(subscribe(reader, path, selector=selector))
            subids.add(reply.find(f"{tag(PUBSUB, 'pubsub')}/{tag(PUBSUB, 'subscription')}")
                       .get("subid"))
        assert len(subids) == 2
        ok(owner.pubsub("set", f"<publish node='{path}'><item id='both'>"
                               "<n xmlns='urn:t'>1</n></item></publish>"))
        _, item = reader.event("item", timeout=30, node=path)
        assert item.get("id") == "both"
        assert no_item(reader, 1.5)  # matched by both selectors, delivered once
        ok(owner.pubsub("set", f"<delete node='{path}'/>", owner=True))
        reasons = [ended_fields(ended(reader)) for _ in range(2)]
        assert reasons == [(path, bare(reader), "none", "removed")] * 2
    finally:
        owner.close()
        reader.close()
