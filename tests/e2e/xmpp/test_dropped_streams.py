"""Issue 34, item 1: a session ends whenever its transport ends, by whatever path.

Fifty streams of one account bind, take items of a queue node, send ``<close/>`` and close
the WebSocket at once (without waiting for the server's ``<close/>``), while items are
published to that queue node and to a fan-out node the account subscribes. Afterwards no
session of the account is live, nothing was consumed (no stream ever retracted an item,
so no item may be ACKED), every item is still deliverable to a later stream, and Daphne
logged no traceback for these ordinary closes. And an item counts an attempt (toward its
max retries, profile §9.6) only for the streams it was written to.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress

import pytest

from tests.conftest import BrokerProcess, query_database
from tests.support.timing import scaled, wait_until
from tests.support.xmpp_session import (
    EVENT,
    FRAMING,
    StreamEnded,
    XmppSession,
    tag,
    url_log,
    xmpp_stack,
)

from .test_xmpp import SETUP, create, ok, publish, subscribe

pytestmark = pytest.mark.e2e

CLOSERS = 50
QUEUE_ITEMS = 60
FANOUT_ITEMS = 30

# jtegen's XMPP sessions not ended, read straight from the database (no manage.py start).
LIVE = """SELECT COUNT(*) FROM accounts_loginsession s
          JOIN accounts_account a ON a.id = s.account_id
          WHERE a.username = 'jtegen' AND s.ended IS NULL AND s.auth_method LIKE 'xmpp:%%'"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def xmpp(request, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-drop")
    with xmpp_stack(request.param, base, SETUP) as stack:
        yield stack


def _closer(url: str, queue: str, errors: list[BaseException]) -> None:
    try:
        s = XmppSession(url)
        s.login("jtegen", resource=f"c{uuid.uuid4().hex[:8]}")
        ok(subscribe(s, queue, 4))
        s.send(f"<close xmlns='{FRAMING}'/>")
        s.close()  # at once: the server's <close/> and anything after it go unread
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.timeout(360)  # 50 streams and their logins, with the stack's start: a busy CI
def test_streams_closed_right_after_close_end_their_sessions_and_lose_nothing(xmpp):
    broker, url = xmpp
    pub = XmppSession(url)
    pub.login("alice")
    queue, fanout = f"/x/q{uuid.uuid4().hex[:8]}", f"/x/f{uuid.uuid4().hex[:8]}"
    # Every closer may really be sent an item before its <close/> is read (the profile then
    # counts an attempt, §9.6): retries enough for all of them, so that only a swallowed or
    # miscounted item can be missing below.
    create(pub, queue, queue=True, retry=300, max_retries=CLOSERS)
    create(pub, fanout)
    first = XmppSession(url)
    first.login("jtegen", resource="setup")
    ok(subscribe(first, fanout))
    first.close()
    log_start = url_log[url].stat().st_size

    errors: list[BaseException] = []
    queue_ids: list[str] = []

    def publisher() -> None:
        try:
            for i in range(QUEUE_ITEMS):
                queue_ids.append(publish(pub, queue, f"<n xmlns='urn:q'>{i}</n>"))
        except BaseException as exc:
            errors.append(exc)

    racing = threading.Thread(target=publisher)
    closers = [threading.Thread(target=_closer, args=(url, queue, errors))
               for _ in range(CLOSERS)]
    racing.start()
    for t in closers:
        t.start()
    for t in [racing, *closers]:
        t.join(scaled(120))
    assert not errors, errors
    assert len(queue_ids) == QUEUE_ITEMS
    # Idle from here on it would not answer Daphne's keepalive pings (websocket-client answers
    # only while reading), and Daphne drops a stream that does not within 30 s.
    pub.close()

    # No session of the account stays live once its transport ended.
    wait_until(lambda: query_database(broker.env, LIVE) == [(0,)], 30, interval=0.2,
               message="no session of jtegen live")

    # Published after they all closed: nobody may have taken these.
    pub = XmppSession(url)
    pub.login("alice")
    fanout_ids = [publish(pub, fanout, f"<n xmlns='urn:f'>{i}</n>") for i in range(FANOUT_ITEMS)]

    later = XmppSession(url)
    later.login("jtegen", resource="later")
    got_fanout = {later.event("item", node=fanout, timeout=60)[1].get("id")
                  for _ in fanout_ids}
    assert got_fanout == set(fanout_ids)
    ok(subscribe(later, queue, 16))
    got_queue: set[str] = set()
    while len(got_queue) < QUEUE_ITEMS:
        item_id = later.event("item", node=queue, timeout=60)[1].get("id")
        assert item_id not in got_queue
        got_queue.add(item_id)
        ok(later.pubsub("set", f"<retract node='{queue}'><item id='{item_id}'/></retract>"))
    assert got_queue == set(queue_ids)
    later.close()
    pub.close()

    with url_log[url].open(errors="replace") as log:
        log.seek(log_start)
        text = log.read()
    assert "Traceback" not in text, text[-3000:]


ATTEMPTS = ("import json\nfrom broker.models import Delivery as D\n"
            "print(json.dumps({{str(m): [a, s] for m, a, s in D.objects.filter("
            "message__topic__path={node!r}).values_list('message_id', 'attempts', 'state')}}))")


def test_an_item_counts_an_attempt_only_for_the_streams_it_was_written_to(xmpp):
    """Streams that take items of a queue node and end at once: the server may lock an item
    for one of them and then find the stream gone before the item is written (its pump
    cancelled by the end, or the write refused). Such a lock gives its attempt back, or a
    few dropped streams would make an item dead (max retries) that nobody ever received.
    Each stream here reads whatever was written to it until the closing handshake ends, so
    the attempts stored must be exactly the streams that received each item."""
    broker, url = xmpp
    pub = XmppSession(url)
    pub.login("alice")
    queue = f"/x/w{uuid.uuid4().hex[:8]}"
    create(pub, queue, queue=True, retry=300, max_retries=2)
    ids = [publish(pub, queue, f"<n xmlns='urn:w'>{i}</n>") for i in range(3)]
    pub.close()

    received: Counter[str] = Counter()
    for k in range(6):
        s = XmppSession(url)
        s.login("jtegen", resource=f"w{k}")
        ok(subscribe(s, queue, 4))
        s.send(f"<close xmlns='{FRAMING}'/>")
        s.ws.send_close()  # at once; every frame written before the handshake still arrives
        with suppress(StreamEnded):
            while True:
                s.next_frame(timeout=30)
        s.close()
        received.update(item.get("id") for frame in s.frames
                        for item in frame.iter(tag(EVENT, "item")))

    stored = json.loads(broker.manage("shell", "--no-imports", "-c",
                                      ATTEMPTS.format(node=queue)).stdout)
    assert {i: stored[i][0] for i in ids} == {i: received[i] for i in ids}
    alive = {i for i in ids if received[i] <= 2}
    assert {i for i in ids if stored[i][1] == "dead"} == set(ids) - alive

    later = XmppSession(url)
    later.login("jtegen", resource="w-later")
    ok(subscribe(later, queue, 4))
    got = {later.event("item", node=queue, timeout=60)[1].get("id") for _ in alive}
    assert got == alive
    later.close()
