"""Kill and partition tests on a real 3-node cluster (deploy/local.py): every client goes
through HAProxy; a broker node, the PostgreSQL primary, the Redis master or the beat lease
holder is killed (SIGKILL, as a machine dies), or a node's cable is pulled, while publishers
and queue and fan-out consumers run. Every message confirmed to a publisher is delivered
and none is ACKed twice. Times are printed for the record (``-s``), never asserted."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from deploy.local import FRONT, HUB
from tests.support.cluster_load import (
    Consumer,
    Publisher,
    assert_exactly_once,
    check,
    wait_drained,
)

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(900)]


def note(what: str, seconds: float) -> None:
    print(f"\n[cluster timing] {what}: {seconds:.1f} s")


@contextmanager
def load(cluster, publishers: int = 4, drain_timeout: float = 240):
    """4 publishers, 2 queue consumers (accounts q0, q1) and 2 fan-out consumers (f0, f1),
    all through HAProxy's SMQP port; on the way out the publishers stop, the consumers drain
    everything confirmed, and the exactly-once promises are checked."""
    stop_pub, stop_sub = threading.Event(), threading.Event()
    pubs = [Publisher(f"p{i}", HUB, FRONT["smqp"], stop_pub, pause=0.02)
            for i in range(publishers)]
    queue = [Consumer(f"q{i}", HUB, FRONT["smqp"], stop_sub, f"q{i}", "/jobs")
             for i in range(2)]
    fan = [Consumer(f"f{i}", HUB, FRONT["smqp"], stop_sub, f"f{i}", "/fan") for i in range(2)]
    for c in queue + fan:
        c.start()
        assert c.ready.wait(60)
    for p in pubs:
        p.start()
        assert p.ready.wait(60)
    try:
        yield pubs, queue, fan
        stop_pub.set()
        for p in pubs:
            p.join(timeout=60)
        check([p.failure for p in pubs])
        confirmed = sum(len(v) for p in pubs for v in p.confirmed.values())
        drained = wait_drained(cluster.database_url, pubs, queue, fan, drain_timeout)
        time.sleep(6)  # past the retry timeout: a message delivered again would show now
        assert_exactly_once(queue, fan)
        print(f"\n[cluster] {confirmed} confirmed publishes ({sum(p.attempts for p in pubs)} "
              f"attempts), drained {drained:.1f} s after the publishers stopped; "
              f"reconnects: {sum(c.reconnects for c in pubs + queue + fan)}")
    finally:
        stop_pub.set()
        stop_sub.set()
        for c in pubs + queue + fan:
            c.join(timeout=30)


def progress(pubs) -> int:
    return sum(len(v) for p in pubs for v in p.confirmed.values())


def wait_progress(pubs, more: int = 20, timeout: float = 180) -> float:
    """Seconds until the publishers have had ``more`` further publishes confirmed."""
    start, base = time.monotonic(), progress(pubs)
    while progress(pubs) < base + more:
        check([p.failure for p in pubs])
        assert time.monotonic() - start < timeout, "publishing did not resume"
        time.sleep(0.1)
    return time.monotonic() - start


def test_kill_a_broker_node_under_load(cluster):
    victim = cluster.nodes[0]
    try:
        with load(cluster) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            killed = time.monotonic()
            cluster.kill_node(victim)
            note("publishing resumed after a node was killed", wait_progress(pubs, 50))
            note("since the kill", time.monotonic() - killed)
            time.sleep(5)
    finally:
        cluster.start_node(victim)
        cluster.wait_node_ready(victim)


def test_cut_a_nodes_link_for_30_seconds(cluster):
    victim = cluster.nodes[1]
    try:
        with load(cluster) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            cluster.cut_link(victim, up=False)
            note("publishing resumed after a node's link was cut", wait_progress(pubs, 50))
            time.sleep(30 - 5)
            cluster.cut_link(victim, up=True)
            wait_progress(pubs, 50)
    finally:
        cluster.cut_link(victim, up=True)
        cluster.wait_node_ready(victim)


def test_kill_the_postgresql_primary(cluster):
    leader = cluster.pg_leader()
    assert leader in ("pg1", "pg2")
    other = "pg2" if leader == "pg1" else "pg1"
    try:
        with load(cluster) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            killed = time.monotonic()
            cluster.kill_pg_member(leader)
            from deploy.local import _wait

            _wait(lambda: cluster.pg_leader() == other, 120, "Patroni to promote the replica")
            note("Patroni promoted the replica", time.monotonic() - killed)
            wait_progress(pubs, 50)
            note("publishing resumed after the PostgreSQL primary was killed",
                 time.monotonic() - killed)
    finally:
        cluster.restart_pg_member(leader)
        from deploy.local import HUB as hub
        from deploy.local import PATRONI_REST, _wait, http_status

        _wait(lambda: http_status(f"http://{hub}:{PATRONI_REST[leader]}/sync") == 200, 300,
              "the old primary to rejoin as the synchronous replica")


def test_kill_the_redis_master(cluster):
    master = cluster.redis_master()
    try:
        with load(cluster) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            killed = time.monotonic()
            cluster.kill_redis(master[1])
            from deploy.local import _wait

            _wait(lambda: cluster.redis_master() != master, 120, "Sentinel to fail over")
            note("Sentinel failed over", time.monotonic() - killed)
            wait_progress(pubs, 50)
            # Delivery (wake-ups through the new master) resumes: the drain on the way out
            # checks every confirmed message arrives.
            note("publishing resumed after the Redis master was killed",
                 time.monotonic() - killed)
    finally:
        from deploy.local import REDIS_PORTS

        cluster.restart_redis(master[1], replica_of=cluster.redis_master())
        assert REDIS_PORTS


def test_kill_the_node_holding_the_beat_lease(cluster):
    holders = cluster.lease_holders()
    node_name = holders["celery-beat"].split(":")[0]
    victim = next(n for n in cluster.nodes if n.name == node_name)
    killed = time.monotonic()
    try:
        cluster.kill_node(victim)
        from deploy.local import _wait

        new = _wait(lambda: (h := cluster.lease_holders().get("celery-beat"))
                    and not h.startswith(node_name + ":") and h, 120,
                    "another node to take the beat lease")
        note(f"beat lease taken over by {new.split(':')[0]}", time.monotonic() - killed)
    finally:
        cluster.start_node(victim)
        cluster.wait_node_ready(victim)


def test_500_sessions_reconnect_at_once_after_their_node_dies(cluster):
    """500 sessions on one node (connected to it directly), the node killed: every client
    reconnects through HAProxy at the same moment. Logins include their password hashing
    (the test cluster's hashes use SMQP_PBKDF2_ITERATIONS from its environment)."""
    from concurrent.futures import ThreadPoolExecutor

    from deploy.local import NODE_PORTS
    from tests.support.smqp_session import Session

    victim = cluster.nodes[2]
    names = [f"r{i}" for i in range(500)]
    with ThreadPoolExecutor(64) as pool:
        sessions = list(pool.map(
            lambda n: Session(victim.addr, NODE_PORTS["smqp"], n, timeout=120), names))
    try:
        cluster.kill_node(victim)
        for s in sessions:
            s.close()
        started = time.monotonic()

        def again(name: str) -> float:
            deadline = started + 600
            while True:
                try:
                    with Session(HUB, FRONT["smqp"], name, timeout=120) as s:
                        assert s.command("NOOP").code == 200
                    return time.monotonic() - started
                except (OSError, AssertionError, ConnectionError):
                    assert time.monotonic() < deadline
                    time.sleep(0.2)

        with ThreadPoolExecutor(500) as pool:
            times = sorted(pool.map(again, names))
        note("500 sessions all logged in again (the last)", times[-1])
        note("500 sessions: median login after the kill", times[len(times) // 2])
        assert len(times) == 500
    finally:
        cluster.start_node(victim)
        cluster.wait_node_ready(victim)
