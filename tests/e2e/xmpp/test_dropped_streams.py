"""Issue 34, item 1: a session ends whenever its transport ends, by whatever path.

Fifty streams of one account bind, take items of a queue node, send ``<close/>`` and close
the WebSocket at once (without waiting for the server's ``<close/>``), while items are
published to that queue node and to a fan-out node the account subscribes. Afterwards no
session of the account is live, nothing was consumed (no stream ever retracted an item,
so no item may be ACKED), every item is still deliverable to a later stream, and Daphne
logged no traceback for these ordinary closes.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import BrokerProcess
from tests.support.xmpp_session import FRAMING, XmppSession, url_log, xmpp_stack

from .test_xmpp import SETUP, create, ok, publish, subscribe

pytestmark = pytest.mark.e2e

CLOSERS = 50
QUEUE_ITEMS = 60
FANOUT_ITEMS = 30

LIVE = ("from accounts.models import LoginSession as L\n"
        "print(L.objects.filter(account__username='jtegen', ended__isnull=True,"
        " auth_method__startswith='xmpp:').count())")


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
@pytest.mark.xfail(reason="passes on the session branch, hangs past its timeout on merged "
                   "main (issue 34 item 1 reopened: cause not found yet)", strict=False)
def test_streams_closed_right_after_close_end_their_sessions_and_lose_nothing(xmpp):
    broker, url = xmpp
    pub = XmppSession(url)
    pub.login("alice")
    queue, fanout = f"/x/q{uuid.uuid4().hex[:8]}", f"/x/f{uuid.uuid4().hex[:8]}"
    create(pub, queue, queue=True, retry=300)
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
        t.join(120)
    assert not errors, errors
    assert len(queue_ids) == QUEUE_ITEMS

    # No session of the account stays live once its transport ended.
    deadline = time.monotonic() + 30
    while (live := broker.manage("shell", "--no-imports", "-c", LIVE).stdout.strip()) != "0":
        assert time.monotonic() < deadline, f"{live} sessions still live"
        time.sleep(0.5)

    # Published after they all closed: nobody may have taken these.
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
