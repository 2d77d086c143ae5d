"""Federation (profile §9.5): a link killed mid-stream loses nothing and duplicates nothing.

Two real brokers, A (a.test) and B (b.test). B's link to A forwards a stream A's publisher
writes; mid-stream B is killed with SIGKILL, its listener and its link supervisor both (the
link dies between a message's commit at B and its 310 ACK, or before either). A keeps
publishing and holds the rest for B (the link's backlog the admin shows); B comes back on
the same port and its link catches up: every message is stored at B exactly once, in A's
order, and B's subscriber gets every one.
"""

from __future__ import annotations

import signal

import pytest

from tests.e2e.federation.test_triangle import (
    publish,
    state,
    stored_origins,
    subscribe,
    wait_subscribed,
)
from tests.support.federation_net import federation, wait_for
from tests.support.smqp_session import Session, header
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

FIRST, SECOND = 150, 100


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill_mid_stream_loses_and_duplicates_nothing(backend, tmp_path):
    with federation(backend, tmp_path, names=("a", "b")) as domains:
        a, b = domains["a"], domains["b"]
        bob = subscribe(b, "/a/news/kill")
        wait_subscribed(b, "a", "/news/kill")
        sent = publish(a, "/news/kill", 1, n=FIRST, tag="first")
        # Mid-stream: some stored at B, the link busy with the rest.
        wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= 10, 180,
                 "B to store the first messages", interval=0.05)
        for proc in (b.links, b.listener.proc):
            proc.send_signal(signal.SIGKILL)
        for proc in (b.links, b.listener.proc):
            proc.wait(timeout=scaled(30))
        at_kill = len(stored_origins(b, "/a/news/kill"))
        bob.close()
        sent += publish(a, "/news/kill", 1, n=SECOND, tag="second")
        # A holds what B has not stored and ACKed: the backlog of A's link to B.
        assert state(a)["b"]["backlog"] > 0
        b.start_listener(port=b.port)
        b.start_links()
        origins = [f"a.test/{n}" for n in sent]
        wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= len(origins), 300,
                 "B to catch up", interval=0.5)
        wait_for(lambda: state(a)["b"]["backlog"] == 0, 120, "A's backlog for B to empty")
        rows = stored_origins(b, "/a/news/kill")
        # Every message once, in A's order (B's smuids follow A's).
        assert [r[1] for r in rows] == origins, (at_kill, rows)
        # B's subscriber gets every one; a repeat only of what it had not ACKed when B died.
        with Session(b.host, b.port, "bob") as again:
            got = []
            while not set(origins) <= set(got):
                got.append(header(again.message(timeout=120), "X-Origin"))
                again.ack()
        assert sorted(set(got), key=origins.index) == origins
        print(f"{backend}: {at_kill} of {FIRST} stored at B when it was killed; dropped as "
              f"duplicates after: {state(b)['a']['dropped']}; "
              f"{len(got) - len(set(got))} repeated to the new session")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_peer_killed_mid_stream_the_link_reconnects_and_catches_up(backend, tmp_path):
    """The other end: A's listener (where B's link is logged in) killed with SIGKILL while
    it sends. B's link reconnects with its backoff once A is back, and A sends again what B
    had not ACKed; B stores each message once, in order."""
    with federation(backend, tmp_path, names=("a", "b")) as domains:
        a, b = domains["a"], domains["b"]
        bob = subscribe(b, "/a/news/kill")
        wait_subscribed(b, "a", "/news/kill")
        origins = [f"a.test/{n}" for n in publish(a, "/news/kill", -1, n=FIRST, tag="x")]
        wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= 10, 180,
                 "B to store the first messages", interval=0.05)
        a.listener.proc.send_signal(signal.SIGKILL)
        a.listener.proc.wait(timeout=scaled(30))
        at_kill = len(stored_origins(b, "/a/news/kill"))
        wait_for(lambda: state(b)["a"]["state"] in ("down", "connecting"), 60,
                 "B's link to notice")
        a.start_listener(port=a.port)
        wait_for(lambda: len(stored_origins(b, "/a/news/kill")) >= len(origins), 300,
                 "B to catch up", interval=0.5)
        assert [r[1] for r in stored_origins(b, "/a/news/kill")] == origins, at_kill
        got = []
        while not set(origins) <= set(got):
            got.append(header(bob.message(timeout=120), "X-Origin"))
            bob.ack()
        assert got == origins
        bob.close()
        print(f"{backend}: {at_kill} of {FIRST} stored at B when A was killed")
