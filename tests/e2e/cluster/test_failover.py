"""Kill and partition tests on a real 3-node cluster (deploy/local.py): every client goes
through HAProxy; a broker node, the PostgreSQL primary, the Redis master or the beat lease
holder is killed (SIGKILL, as a machine dies), or a node's cable is pulled, while publishers
and queue and fan-out consumers run. Every message confirmed to a publisher is delivered
and none is ACKed twice, at both doors: SMQP sessions on HAProxy's SMQP port and XMPP streams
over its WebSocket (HTTP) port. Times are printed for the record (``-s``), never asserted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager
from itertools import pairwise

import pytest

from deploy.local import FRONT, HUB
from tests.support.cluster_load import (
    RETRY,
    Consumer,
    Publisher,
    assert_exactly_once,
    check,
    wait_drained,
)
from tests.support.timing import scaled

from .xmpp_load import XMPP_FAN, XMPP_QUEUE, XmppFanout, XmppQueueWorker

XMPP_URL = f"ws://{HUB}:{FRONT['http']}/xmpp-websocket"

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(900)]


def note(what: str, seconds: float) -> None:
    print(f"\n[cluster timing] {what}: {seconds:.1f} s")


@contextmanager
def load(cluster, publishers: int = 4, drain_timeout: float = 240, *,
         store_stays: bool = False):
    """4 publishers, 2 queue consumers (accounts q0, q1) and 2 fan-out consumers (f0, f1)
    through HAProxy's SMQP port, and 2 XMPP queue workers (xq0, xq1) and an XMPP fan-out
    subscriber (xf0) through its WebSocket port; on the way out the publishers stop, the
    consumers drain everything confirmed, and the exactly-once promises are checked.

    ``store_stays``: no node dies and PostgreSQL stays up (the Redis kill): an XMPP fan-out
    item's ACK then commits a few milliseconds after it was written, and an item sent on a
    later stream again fails the test too. Otherwise that is reported as xfail: a node gone,
    cut off or without its database holds such an ACK (in memory, retried) that the store
    does not have yet, and a stream on another node is sent the item again meanwhile."""
    stop_pub, stop_sub = threading.Event(), threading.Event()
    pubs = [Publisher(f"p{i}", HUB, FRONT["smqp"], stop_pub, pause=0.02)
            for i in range(publishers)]
    queue = [Consumer(f"q{i}", HUB, FRONT["smqp"], stop_sub, f"q{i}", "/jobs")
             for i in range(2)]
    fan = [Consumer(f"f{i}", HUB, FRONT["smqp"], stop_sub, f"f{i}", "/fan") for i in range(2)]
    xqueue = [XmppQueueWorker(name, XMPP_URL, stop_sub, name) for name in XMPP_QUEUE]
    xfan = [XmppFanout(name, XMPP_URL, stop_sub, name) for name in XMPP_FAN]
    subs = queue + fan + xqueue + xfan
    for c in subs:
        c.start()
        assert c.ready.wait(scaled(60))
    check([c.failure for c in subs])
    for p in pubs:
        p.start()
        assert p.ready.wait(scaled(60))
    try:
        yield pubs, queue + xqueue, fan + xfan
        stop_pub.set()
        for p in pubs:
            p.join(timeout=scaled(60))
        check([p.failure for p in pubs])
        confirmed = sum(len(v) for p in pubs for v in p.confirmed.values())
        drained = wait_drained(cluster.database_url, pubs, queue + xqueue, fan + xfan,
                               drain_timeout)
        # A quiet window after the drain: past the retry timeout, a message delivered again
        # shows now.
        time.sleep(scaled(RETRY + 1))
        assert_exactly_once(queue, fan)
        same_stream, later_stream = assert_xmpp_exactly_once(queue, xqueue, xfan)
        print(f"\n[cluster] {confirmed} confirmed publishes ({sum(p.attempts for p in pubs)} "
              f"attempts), drained {drained:.1f} s after the publishers stopped; "
              f"reconnects: SMQP {sum(c.reconnects for c in pubs + queue + fan)}, XMPP "
              f"{sum(c.reconnects for c in xqueue + xfan)}; queue items consumed over XMPP "
              f"{sum(len(w.consumed) for w in xqueue)}, over SMQP "
              f"{sum(len(c.acked) for c in queue)}; XMPP retracts refused "
              f"{sum(len(w.refused) for w in xqueue)}")
        # XMPP-PROFILE §3: a fan-out item is delivered once written to a stream and not sent
        # again. Never twice on one stream (issue 37: a backlog read while written items'
        # ACKs waited for the door's flush sent them twice).
        assert not same_stream, f"XMPP fan-out items sent twice on one stream: {same_stream}"
        if later_stream:
            message = f"XMPP fan-out items sent again on a later stream: {later_stream}"
            assert not store_stays, message
            pytest.xfail(f"{message} (written, their ACK not in the store yet when the "
                         "stream broke: held by a node dead, cut off or without PostgreSQL)")
    finally:
        stop_pub.set()
        stop_sub.set()
        for c in pubs + subs:
            c.join(timeout=scaled(30))


def assert_xmpp_exactly_once(queue: list[Consumer], xqueue: list[XmppQueueWorker],
                             xfan: list[XmppFanout]) -> tuple[str, str]:
    """No queue item consumed twice across both doors (an SMQP 310 ACK or an XMPP retract
    answered with a result). Fan-out items sent twice to an XMPP subscriber are returned,
    described (stream number and time of each copy, when each stream ended), for the
    caller to judge after the other checks: (those with two copies on one stream, those
    sent again only on a later stream)."""
    consumed = Counter(m for c in queue + xqueue for m in c.acked)
    twice = [m for m, n in consumed.items() if n > 1]
    assert not twice, f"queue items consumed twice (SMQP and XMPP together): {twice[:20]}"
    same: list[str] = []
    later: list[str] = []
    for c in xfan:
        copies = {m: [(stream, f"{at:.3f}") for s, stream, at in c.received if s == m]
                  for m, n in Counter(c.notified).items() if n > 1}
        for found, wanted in ((same, True), (later, False)):
            these = {m: seen for m, seen in copies.items()
                     if (len({stream for stream, _ in seen}) < len(seen)) is wanted}
            if these:
                found.append(f"{c.account}: (stream, time) {dict(list(these.items())[:20])}; "
                             f"streams ended at {c.broke}")
    return "; ".join(same), "; ".join(later)


def progress(pubs) -> int:
    return sum(len(v) for p in pubs for v in p.confirmed.values())


def wait_progress(pubs, more: int = 20, timeout: float = 180) -> float:
    """Seconds until the publishers have had ``more`` further publishes confirmed."""
    start, base = time.monotonic(), progress(pubs)
    while progress(pubs) < base + more:
        check([p.failure for p in pubs])
        assert time.monotonic() - start < scaled(timeout), "publishing did not resume"
        time.sleep(0.1)
    return time.monotonic() - start


def locks_in_store(database_url: str, smuids: list[int]) -> dict[int, tuple[str, str]]:
    """(state, holder) of each queue delivery of ``smuids``."""
    import psycopg

    with psycopg.connect(database_url, connect_timeout=int(scaled(5))) as db:
        return {m: (state, holder) for m, state, holder in db.execute(
            "SELECT message_id, state, holder FROM broker_delivery WHERE message_id = ANY(%s)",
            (smuids,)).fetchall()}


LOCK_ITEMS = 6


def hold_locks_on(node, database_url: str) -> tuple[list, list[int], set[int]]:
    """Queue sessions on ``node`` itself (not through HAProxy) that take items of the lock
    test's topic and hold their locks without consuming them: an SMQP session (one lock at a
    time) and an XMPP stream (``queue_requests`` 3). Publishes the items, waits until each
    holder has a lock in the store: (the holders' sessions, the items, those locked)."""
    from deploy.local import NODE_PORTS, _wait
    from tests.support.smqp_session import Session

    from .xmpp_load import LOCK_HOLDERS, LOCKS_TOPIC, XmppHolder

    smqp = Session(node.addr, NODE_PORTS["smqp"], LOCK_HOLDERS["smqp"], timeout=60)
    assert smqp.command(f"SUB MESSAGE {LOCKS_TOPIC}").code == 200
    xmpp = XmppHolder(f"ws://{node.addr}:{NODE_PORTS['http']}/xmpp-websocket",
                      LOCK_HOLDERS["xmpp"], LOCKS_TOPIC, count=3)
    with Session(HUB, FRONT["smqp"], "pub", timeout=60) as pub:
        items = []
        for i in range(LOCK_ITEMS):
            reply = pub.publish(LOCKS_TOPIC, f"lock-{i}")
            assert reply.code == 200, reply
            items.append(int(reply.lines[-1].split()[-1]))

    def holders_of_locks() -> dict[int, str]:
        """Item → the holder account whose session has it locked."""
        return {m: holder for m, (state, holder) in locks_in_store(database_url, items).items()
                if state == "notified" and holder.startswith(tuple(LOCK_HOLDERS.values()))}

    # A lock's holder is the session's guid: its account name and a number.
    _wait(lambda: {h.rstrip("0123456789") for h in holders_of_locks().values()}
          == set(LOCK_HOLDERS.values()), 60, "both holders to lock an item")
    return [smqp, xmpp.s], items, set(holders_of_locks())


def test_kill_a_broker_node_under_load(cluster):
    """Besides the load's promises: the locks that sessions on the killed node held (SMQP
    and XMPP) end, and each of those items is consumed once, by a live session."""
    from deploy.local import _wait

    from .xmpp_load import LOCK_WORKERS, LOCKS_RETRY, LOCKS_TOPIC

    victim = cluster.nodes[0]
    killed_it = False
    holders: list = []
    stop_live = threading.Event()
    live: list = []
    try:
        with load(cluster) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            holders, items, locked = hold_locks_on(victim, cluster.database_url)
            killed = time.monotonic()
            cluster.kill_node(victim)
            killed_it = True
            for s in holders:
                s.close()
            # The dead node's locks are still in the store: nobody released them.
            left = {m for m, (state, _) in locks_in_store(cluster.database_url, items).items()
                    if state == "notified" and m in locked}
            note(f"{len(left)} locks left by the killed node's SMQP and XMPP sessions "
                 f"(lock timeout {LOCKS_RETRY} s), checked", time.monotonic() - killed)
            assert left, "the holders' locks ended before their node was killed"
            note("publishing resumed after a node was killed", wait_progress(pubs, 50))
            note("since the kill", time.monotonic() - killed)
            live = [Consumer("ls", HUB, FRONT["smqp"], stop_live, LOCK_WORKERS["smqp"],
                             LOCKS_TOPIC),
                    XmppQueueWorker("lx", XMPP_URL, stop_live, LOCK_WORKERS["xmpp"],
                                    node=LOCKS_TOPIC)]
            for w in live:
                w.start()
                assert w.ready.wait(scaled(60))

            def consumers_of(smuid: int) -> list[str]:
                return [w.name for w in live for m in w.acked if m == smuid]

            _wait(lambda: all(consumers_of(m) for m in items)
                  or any(w.failure for w in live), 240,
                  "every item of the lock test to be consumed by live sessions")
            check([w.failure for w in live])
            note(f"the killed node's locked items consumed by live sessions (lock timeout "
                 f"{LOCKS_RETRY} s, lock sweep every 5 s), since the kill",
                 time.monotonic() - killed)
            time.sleep(scaled(2))  # an item sent again would show now (a quiet window)
            consumed_by = {m: consumers_of(m) for m in items}
            assert all(len(who) == 1 for who in consumed_by.values()), consumed_by
            final = locks_in_store(cluster.database_url, items)
            assert all(state == "acked" for state, _ in final.values()), final
    finally:
        stop_live.set()
        for w in live:
            w.join(scaled(30))
        for s in holders:
            s.close()
        if killed_it:
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
            timeline = Timeline(cluster, killed, pubs)
            timeline.start()
            cluster.kill_pg_member(leader)
            from deploy.local import _wait

            _wait(lambda: cluster.pg_leader() == other, 120, "Patroni to promote the replica")
            note("Patroni promoted the replica", time.monotonic() - killed)
            try:
                wait_progress(pubs, 50)
            except AssertionError as exc:  # why not: each node's checks, and the timeline
                timeline.report()
                raise AssertionError(f"{exc}; each node's /readyz: {readiness(cluster)}") \
                    from exc
            note("publishing resumed after the PostgreSQL primary was killed",
                 time.monotonic() - killed)
            time.sleep(3)
            timeline.report()
    finally:
        cluster.restart_pg_member(leader)
        from deploy.local import HUB as hub
        from deploy.local import PATRONI_REST, _wait, http_status

        _wait(lambda: http_status(f"http://{hub}:{PATRONI_REST[leader]}/sync") == 200, scaled(300),
              "the old primary to rejoin as the synchronous replica")


class Timeline(threading.Thread):
    """From a failure on, polls what a resume is made of, for the record: when every node's
    own /readyz answers 200 again, and when HAProxy counts every SMQP node UP again."""

    def __init__(self, cluster, since: float, pubs) -> None:
        super().__init__(daemon=True)
        self.cluster, self.since, self.pubs = cluster, since, pubs
        self.done = threading.Event()
        self.marks: dict[str, float] = {}
        self.confirms: list[float] = []  # when the confirmed count grew, since the failure

    def mark(self, what: str) -> None:
        """The first time ``what`` was seen."""
        self.marks.setdefault(what, time.monotonic() - self.since)

    def run(self) -> None:
        from deploy.local import http_status

        count = progress(self.pubs)
        while not self.done.is_set():
            if progress(self.pubs) > count:
                count = progress(self.pubs)
                self.confirms.append(time.monotonic() - self.since)
            try:
                ready = all(http_status(n.url("health", "/readyz"), timeout=1) == 200
                            for n in self.cluster.nodes)
            except OSError:
                ready = False
            up = haproxy_up("smqp_nodes")
            if not ready:
                self.mark("a node not ready")
            elif "a node not ready" in self.marks:
                self.mark("every node ready again")
            if up < len(self.cluster.nodes):
                self.mark("HAProxy took a node out")
                if up == 0:
                    self.mark("HAProxy had no SMQP node")
            elif "HAProxy took a node out" in self.marks:
                self.mark("HAProxy had every node back")
            time.sleep(0.1)

    def report(self) -> None:
        self.done.set()
        self.join(scaled(5))
        # No publish confirmed from the failure to the end of the longest pause after it.
        times = [0.0, *self.confirms]
        gaps = [(b - a, b) for a, b in pairwise(times)]
        if gaps:
            self.marks["first publish confirmed after the longest pause"] = max(gaps)[1]
        for what, at in sorted(self.marks.items(), key=lambda item: item[1]):
            note(what, at)


def readiness(cluster) -> dict[str, str]:
    """Each node's SMQP health port's /readyz answer (its checks), or why there is none."""
    import urllib.error
    import urllib.request

    answers = {}
    for node in cluster.nodes:
        try:
            with urllib.request.urlopen(node.url("health", "/readyz"), timeout=5) as reply:
                answers[node.name] = reply.read().decode()
        except urllib.error.HTTPError as exc:
            answers[node.name] = f"{exc.code} {exc.read().decode()}"
        except OSError as exc:
            answers[node.name] = repr(exc)
    return answers


def haproxy_up(backend: str) -> int:
    """How many servers of ``backend`` HAProxy counts UP (its stats page as CSV)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{HUB}:{FRONT['stats']}/;csv", timeout=1) as r:
            rows = [line.split(",") for line in r.read().decode().splitlines()]
    except OSError:
        return -1
    status = rows[0].index("status") if rows and "status" in rows[0] else 17
    return sum(1 for row in rows[1:] if len(row) > status and row[0] == backend
               and row[1] not in ("FRONTEND", "BACKEND") and row[status].startswith("UP"))


def test_kill_the_redis_master(cluster):
    master = cluster.redis_master()
    try:
        with load(cluster, store_stays=True) as (pubs, _queue, _fan):
            wait_progress(pubs, 100)
            killed = time.monotonic()
            timeline = Timeline(cluster, killed, pubs)
            timeline.start()
            cluster.kill_redis(master[1])
            from deploy.local import _wait

            _wait(lambda: cluster.redis_master() != master, 120, "Sentinel to fail over",
                  interval=0.05)
            note("Sentinel failed over", time.monotonic() - killed)
            wait_progress(pubs, 50)
            # Delivery (wake-ups through the new master) resumes: the drain on the way out
            # checks every confirmed message arrives.
            note("publishing resumed after the Redis master was killed",
                 time.monotonic() - killed)
            time.sleep(3)
            timeline.report()
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
