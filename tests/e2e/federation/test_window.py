"""Federation with a window (issue 39 item 4): B's link to A asks A for up to
``SMQP_LINK_WINDOW`` messages in flight (SET NOTIFY WINDOW, profile §9.7) and stores what
has arrived in one transaction before ACKing each by its smuid. B's link supervisor is killed
mid-stream, with messages in flight (some stored at B and not yet ACKed, some not stored),
and started again: every message is stored at B once, in A's order.
"""

from __future__ import annotations

import signal
import threading

import pytest

from tests.e2e.federation.test_triangle import (
    publish,
    state,
    stored_origins,
    subscribe,
    wait_subscribed,
)
from tests.support.federation_net import federation, wait_for
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WINDOW = 16
COUNT = 300


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_window_in_flight_survives_a_receiver_restart(backend, tmp_path):
    with federation(backend, tmp_path, names=("a", "b"),
                    extra_env={"SMQP_LINK_WINDOW": str(WINDOW)}) as domains:
        a, b = domains["a"], domains["b"]
        bob = subscribe(b, "/a/news/kill")
        wait_subscribed(b, "a", "/news/kill")
        assert b.links_log is not None
        wait_for(lambda: f"link a: window {WINDOW}" in b.links_log.read_text(), 60,
                 "B's link to have its window")
        # A publishes while B's link forwards: B is killed mid-stream, not after it.
        sent: list[int] = []
        publisher = threading.Thread(
            target=lambda: sent.extend(publish(a, "/news/kill", 1, n=COUNT, tag="w")))
        publisher.start()
        try:
            wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= 20, 180,
                     "B to store the first messages", interval=0.05)
            b.links.send_signal(signal.SIGKILL)
            b.links.wait(timeout=scaled(30))
        finally:
            publisher.join(scaled(300))
        at_kill = len(stored_origins(b, "/a/news/kill"))
        assert len(sent) == COUNT
        bob.close()
        b.start_links()
        origins = [f"a.test/{n}" for n in sent]
        wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= len(origins), 300,
                 "B to catch up", interval=0.5)
        wait_for(lambda: state(a)["b"]["backlog"] == 0, 120, "A's backlog for B to empty")
        rows = stored_origins(b, "/a/news/kill")
        # Every message once, in A's order.
        assert [r[1] for r in rows] == origins, (at_kill, rows)
        assert f"link a: window {WINDOW}" in b.links_log.read_text()  # the new session too
        print(f"{backend}: {at_kill} of {COUNT} stored at B when its link was killed; "
              f"dropped as duplicates after: {state(b)['a']['dropped']}")
