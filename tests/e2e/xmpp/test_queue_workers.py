"""Issue 38: competing XMPP workers with many items in flight each.

Four streams of one account subscribe a queue node with ``pubsub#queue_requests`` 16 and
consume (retract) every item they are sent, without waiting for the answer before taking
the next; a few hundred items published meanwhile must all be consumed, each exactly once
(the benchmark's four workers at queue_requests 16 consumed nothing in 600 s).
"""

from __future__ import annotations

import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator

import pytest
import websocket

from tests.conftest import BrokerProcess
from tests.support.timing import scaled
from tests.support.xmpp_session import CLIENT, EVENT, StreamEnded, XmppSession, tag, xmpp_stack

from .test_xmpp import SETUP, create, ok, subscribe

pytestmark = pytest.mark.e2e

WORKERS = 4
QUEUE_REQUESTS = 16
ITEMS = 300


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def xmpp(request, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-workers")
    with xmpp_stack(request.param, base, SETUP) as stack:
        yield stack


class Worker(threading.Thread):
    """Retracts every item it is sent at once, answers matched afterwards."""

    def __init__(self, session: XmppSession, path: str, done: threading.Event) -> None:
        super().__init__(daemon=True)
        self.s, self.path, self.done = session, path, done
        self.retracting: dict[str, str] = {}  # iq id → item id
        self.consumed: list[str] = []
        self.refused: list[str] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                try:
                    frame = self.s._read(0.5)
                except websocket.WebSocketTimeoutException:
                    continue
                self._handle(frame)
        except StreamEnded as exc:
            if not self.done.is_set():
                self.failure = exc
        except BaseException as exc:
            self.failure = exc

    def _handle(self, frame: ET.Element) -> None:
        if frame.tag == tag(CLIENT, "message"):
            for item in frame.iter(tag(EVENT, "item")):
                iq_id = self.s.send_iq("set", f"<pubsub xmlns='http://jabber.org/protocol/"
                                       f"pubsub'><retract node='{self.path}'><item id='"
                                       f"{item.get('id')}'/></retract></pubsub>")
                self.retracting[iq_id] = item.get("id")
        elif frame.tag == tag(CLIENT, "iq") and frame.get("id") in self.retracting:
            item_id = self.retracting.pop(frame.get("id"))
            (self.consumed if frame.get("type") == "result" else self.refused).append(item_id)


def test_four_workers_with_queue_requests_16_consume_every_item_once(xmpp):
    _, url = xmpp
    pub = XmppSession(url)
    pub.login("alice")
    path = f"/x/w{uuid.uuid4().hex[:8]}"
    create(pub, path, queue=True, retry=300)
    first = XmppSession(url)
    first.login("bob", resource="first")
    ok(subscribe(first, path, 1))
    first.close()

    def publish_many(numbers: range) -> None:
        """Pipelined publishes, answers read afterwards."""
        sent = [pub.send_iq("set", f"<pubsub xmlns='http://jabber.org/protocol/pubsub'>"
                            f"<publish node='{path}'><item id='i{n}'><n xmlns='urn:w'>{n}"
                            "</n></item></publish></pubsub>") for n in numbers]
        for iq_id in sent:
            ok(pub.reply(iq_id, timeout=120))

    # Half waits in the store before the workers come (their backlog), half is published
    # while they work.
    publish_many(range(ITEMS // 2))
    done = threading.Event()
    workers = []
    for i in range(WORKERS):
        s = XmppSession(url)
        s.login("bob", resource=f"w{i}")
        workers.append(Worker(s, path, done))
        # The subscribe's answer is read by the worker (items may come right after it).
        s.send_iq("set", f"<pubsub xmlns='http://jabber.org/protocol/pubsub'><subscribe "
                  f"node='{path}' jid='{s.jid.split('/')[0]}'/><options><x xmlns='jabber:x:"
                  "data' type='submit'><field var='pubsub#queue_requests'><value>"
                  f"{QUEUE_REQUESTS}</value></field></x></options></pubsub>")
    for w in workers:
        w.start()
    publish_many(range(ITEMS // 2, ITEMS))
    deadline = time.monotonic() + scaled(240)
    while sum(len(w.consumed) for w in workers) < ITEMS and time.monotonic() < deadline:
        assert all(w.failure is None for w in workers), [w.failure for w in workers]
        time.sleep(0.2)
    time.sleep(scaled(1.0))  # anything sent twice would show up now (a quiet window)
    done.set()
    for w in workers:
        w.join(scaled(10))
    assert all(w.failure is None for w in workers), [w.failure for w in workers]
    counts = Counter(i for w in workers for i in w.consumed)
    assert set(counts) == {f"i{n}" for n in range(ITEMS)}, \
        f"{len(counts)} of {ITEMS} consumed; per worker " \
        f"{[len(w.consumed) for w in workers]}"
    assert max(counts.values()) == 1
    for w in workers:
        w.s.close()
    pub.close()
