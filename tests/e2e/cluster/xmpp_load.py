"""XMPP consumers for the cluster tests, beside the SMQP ones of tests/support/cluster_load.py:
queue workers and a fan-out subscriber over XMPP WebSocket through HAProxy's HTTP port. Each
logs in (PLAIN: the test cluster sets SMQP_XMPP_PLAIN=yes), subscribes again on every new
stream (``pubsub#queue_requests`` belongs to the session) and reconnects, to whichever node
HAProxy picks, when its stream breaks.

A queue worker consumes each item it is sent by retracting it (XEP-0254): ``consumed`` holds
the items whose retract was answered with a result. A fan-out subscriber keeps every item it
was sent, in order, with the stream it came on."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET

import websocket

from tests.support.xmpp_session import (
    CLIENT,
    EVENT,
    PUBSUB,
    StreamEnded,
    XmppSession,
    tag,
)

XMPP_QUEUE = ["xq0", "xq1"]
XMPP_FAN = ["xf0"]
# The lock test (test_kill_a_broker_node_under_load): a queue topic of its own, whose locks
# outlast setting the test up on a busy machine; holders on the node that is killed (SMQP
# and XMPP) and, once it is dead, live workers (SMQP and XMPP) through HAProxy.
LOCKS_TOPIC, LOCKS_RETRY = "/locks", 20
LOCK_HOLDERS = {"smqp": "hs", "xmpp": "xh"}
LOCK_WORKERS = {"smqp": "ls", "xmpp": "lx"}

XMPP_SETUP = f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot

if not Topic.objects.filter(path={LOCKS_TOPIC!r}).exists():
    ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), {LOCKS_TOPIC!r})
Topic.objects.filter(path={LOCKS_TOPIC!r}).update(delivery_mode='queue',
                                                 retry_timeout={LOCKS_RETRY}, max_retries=1000)

def grant(name, paths, rights):
    a = Account.objects.filter(username=name).first()
    if a is None:
        a = Account(username=name)
        a.set_password('pw')
        a.save()
    for path in paths:
        for right in rights:
            UALEntry.objects.get_or_create(topic=Topic.objects.get(path=path),
                                           principal_kind='account', account=a, right=right)

for name in {XMPP_QUEUE + XMPP_FAN!r}:
    grant(name, ('/jobs', '/fan'), ('publish', 'subscribe'))
for name in {[*LOCK_HOLDERS.values(), *LOCK_WORKERS.values()]!r}:
    grant(name, ({LOCKS_TOPIC!r},), ('subscribe',))
grant('pub', ({LOCKS_TOPIC!r},), ('publish',))
"""

BROKEN = (StreamEnded, OSError, ConnectionError, AssertionError, websocket.WebSocketException)


def subscribe_iq(s: XmppSession, node: str, queue_requests: int | None) -> str:
    """Send the subscribe (with ``queue_requests`` on a queue node); its IQ id."""
    bare = s.jid.split("/")[0]
    options = ""
    if queue_requests is not None:
        options = (f"<options node='{node}' jid='{bare}'><x xmlns='jabber:x:data' "
                   "type='submit'><field var='FORM_TYPE' type='hidden'><value>"
                   "http://jabber.org/protocol/pubsub#subscribe_options</value></field>"
                   f"<field var='pubsub#queue_requests'><value>{queue_requests}</value>"
                   "</field></x></options>")
    return s.send_iq("set", f"<pubsub xmlns='{PUBSUB}'><subscribe node='{node}' "
                            f"jid='{bare}'/>{options}</pubsub>")


def items_in(frame: ET.Element) -> list[str]:
    """The item ids of a pubsub item notification (none for anything else)."""
    if frame.tag != tag(CLIENT, "message"):
        return []
    return [item.get("id") for item in frame.iter(tag(EVENT, "item"))]


class XmppClient(threading.Thread):
    def __init__(self, name: str, url: str, stop: threading.Event, account: str, node: str,
                 queue_requests: int | None) -> None:
        super().__init__(name=name, daemon=True)
        self.url, self.stop, self.account, self.node = url, stop, account, node
        self.queue_requests = queue_requests
        self.reconnects = 0
        self.streams = 0
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self.ready = threading.Event()
        self.s: XmppSession | None = None
        self.broke: dict[int, float] = {}  # stream number → when its end was noticed

    def connect(self) -> XmppSession:
        """A logged-in stream subscribed to the node (its subscribe answered with a result);
        tries again until it gets one or is told to stop."""
        while True:
            s = None
            try:
                s = XmppSession(self.url, timeout=10)
                self.streams += 1
                s.login(self.account, resource=f"{self.name}-{self.streams}")
                reply = s.reply(subscribe_iq(s, self.node, self.queue_requests))
                if reply.get("type") == "result":
                    return s
                self.errors.append("subscribe: " + ET.tostring(reply, "unicode")[:200])
            except BROKEN as exc:
                self.errors.append(repr(exc))
            if s is not None:
                # Items sent between the subscribe and a failure are not ours to count: a
                # stream given up here is closed, and its locks go back.
                s.close()
            if self.stop.is_set():
                raise StreamEnded("stopped")
            time.sleep(0.5)

    def run(self) -> None:
        try:
            self.s = self.connect()
            stream = self.streams
            self.ready.set()
            for frame in self.s.pending:
                self.handle(frame, stream)
            self.s.pending.clear()
            while not self.stop.is_set():
                try:
                    try:
                        frame = self.s._read(0.5)
                    except websocket.WebSocketTimeoutException:
                        continue
                    self.handle(frame, stream)
                except BROKEN as exc:
                    self.errors.append(repr(exc))
                    self.broke[stream] = time.time()
                    self.s.close()
                    self.reconnects += 1
                    self.s = self.connect()
                    stream = self.streams
                    for frame in self.s.pending:
                        self.handle(frame, stream)
                    self.s.pending.clear()
        except BaseException as exc:  # reported by the test
            if not self.stop.is_set():
                self.failure = exc
        finally:
            self.ready.set()
            if self.s is not None:
                self.s.close()

    def handle(self, frame: ET.Element, stream: int) -> None:
        raise NotImplementedError


class XmppQueueWorker(XmppClient):
    """Retracts (consumes) every item it is sent at once; ``notified``: every item id sent,
    ``consumed``: those whose retract was answered with a result."""

    def __init__(self, name: str, url: str, stop: threading.Event, account: str,
                 node: str = "/jobs", queue_requests: int = 4) -> None:
        super().__init__(name, url, stop, account, node, queue_requests)
        self.notified: list[int] = []
        self.consumed: list[int] = []
        self.refused: list[str] = []
        self.retracting: dict[str, int] = {}

    @property
    def acked(self) -> list[int]:  # as an SMQP consumer's 310 ACKs
        return self.consumed

    def handle(self, frame: ET.Element, stream: int) -> None:
        for item_id in items_in(frame):
            self.notified.append(int(item_id))
            iq_id = self.s.send_iq("set", f"<pubsub xmlns='{PUBSUB}'><retract node="
                                          f"'{self.node}'><item id='{item_id}'/></retract>"
                                          "</pubsub>")
            self.retracting[iq_id] = int(item_id)
        if frame.tag == tag(CLIENT, "iq") and frame.get("id") in self.retracting:
            smuid = self.retracting.pop(frame.get("id"))
            if frame.get("type") == "result":
                self.consumed.append(smuid)
            else:  # e.g. unexpected-request: its lock had ended (a slow answer)
                self.refused.append(f"{smuid}: {ET.tostring(frame, 'unicode')[:300]}")


class XmppFanout(XmppClient):
    """Keeps every item it is sent: ``received`` as (smuid, stream number, time)."""

    def __init__(self, name: str, url: str, stop: threading.Event, account: str,
                 node: str = "/fan") -> None:
        super().__init__(name, url, stop, account, node, None)
        self.received: list[tuple[int, int, float]] = []

    @property
    def notified(self) -> list[int]:
        return [smuid for smuid, _, _ in self.received]

    def handle(self, frame: ET.Element, stream: int) -> None:
        now = time.time()
        for item_id in items_in(frame):
            self.received.append((int(item_id), stream, now))


class XmppHolder:
    """A queue worker that takes ``count`` items and holds their locks without consuming
    them (on one node, reached directly): what a worker on a machine that dies leaves."""

    def __init__(self, url: str, account: str, node: str, count: int) -> None:
        self.s = XmppSession(url, timeout=30)
        self.s.login(account, resource="holder")
        reply = self.s.reply(subscribe_iq(self.s, node, count))
        assert reply.get("type") == "result", ET.tostring(reply, "unicode")
        self.count = count
        self.held: list[int] = []

    def take(self, timeout: float = 120) -> list[int]:
        while len(self.held) < self.count:
            frame = self.s.expect(lambda e: bool(items_in(e)), timeout, "an item")
            self.held.extend(int(i) for i in items_in(frame))
        return self.held

