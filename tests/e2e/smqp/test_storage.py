"""The listener's storage processes (:mod:`broker.store.lanes`), over real sockets.

Publish and ACK batches commit in child processes of the listener. What the listener itself
changes (a topic created or renamed over SMQP) must reach them before the next batch, not a
cache poll later; a storage process that dies must cost at most the batches it held, never
the listener; and one whose listener died must not live on.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import fresh_listener, start_listener, stop_listener
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (``/proc/<pid>/stat``; OSError once it has gone)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def storage_pids(listener_pid: int) -> list[int]:
    """The storage processes whose parent is ``listener_pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = parent_pid(int(entry.name))
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # The first ones are forked from the listener and set their title to the command a
        # restart runs (one string); a restarted one is that command (its arguments apart).
        if ppid == listener_pid and b" -m broker.services.storage_calls " in \
                cmdline.replace(b"\0", b" "):
            found.append(int(entry.name))
    return sorted(found)


def logged_pids(log: str, how: str) -> set[int]:
    """The storage processes a server's ``log`` says it ``forked`` or ``started``."""
    return {int(pid) for pid in re.findall(rf"storage process \S+ {how} \(pid (\d+)\)", log)}


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_lanes_per_backend(backend, tmp_path):
    """SQLite: one storage process (one writer); PostgreSQL: two for publishes (one builds
    a batch while the other commits one) and one for ACKs. They start with the first
    session, before anything is published."""
    with fresh_listener(backend, tmp_path) as broker, \
            Session(broker.host, broker.port, "root") as s:
        assert s.command("NOOP").code == 200
        want = 1 if backend == "sqlite" else 3
        assert wait_for(lambda: len(storage_pids(broker.proc.pid)) == want), \
            storage_pids(broker.proc.pid)
        # Forked from the listener, which has loaded Django already: none loads it again.
        assert logged_pids(broker.log(), "forked") == set(storage_pids(broker.proc.pid)), \
            broker.log()


def test_topics_the_listener_changes_are_known_to_the_next_publish(tmp_path):
    """CREATE TOPIC or SET TOPIC NAME, then PUB at once: the publish is decided by the
    storage process, whose topic tree must follow the listener's change before the batch
    (its own poll of the shared generation would take up to half a second)."""
    with fresh_listener("sqlite", tmp_path) as broker, \
            Session(broker.host, broker.port, "root") as s:
        assert s.command("CREATE TOPIC /warm").code == 200
        assert s.publish("/warm", "W").code == 200  # the storage process has a tree now
        for i in range(10):
            assert s.command(f"CREATE TOPIC /made{i}").code == 200
            reply = s.publish(f"/made{i}", f"M{i}")
            assert reply.code == 200, reply
            assert s.command(f"SET TOPIC NAME /made{i} /renamed{i}").code == 200
            reply = s.publish(f"/renamed{i}", f"R{i}")
            assert reply.code == 200, reply
            assert s.publish(f"/made{i}", f"X{i}").code == 404


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_killed_storage_process_costs_its_batch_only(backend, tmp_path):
    """kill -9 of the storage processes while publishes are in flight (PostgreSQL: both
    publish lanes, one of them maybe holding a batch before its COMMIT while the other
    waits for it, and the ACK lane): each publish gets a reply (200, or 500 for the batches
    they held), the listener lives on, the next publishes start new storage processes, and
    every message that got 200 is delivered."""
    with fresh_listener(backend, tmp_path) as broker, \
            Session(broker.host, broker.port, "root") as sub, \
            Session(broker.host, broker.port, "root") as pub:
        assert pub.command("CREATE TOPIC /crash").code == 200
        assert sub.command("SUB MESSAGE /crash").code == 200
        assert pub.publish("/crash", "first").code == 200
        victims = storage_pids(broker.proc.pid)
        assert len(victims) == (1 if backend == "sqlite" else 3)
        for i in range(300):
            pub.send_publish("/crash", f"c{i}")
        for victim in victims:
            os.kill(victim, signal.SIGKILL)
        replies = [pub.reply() for _ in range(300)]
        assert {r.code for r in replies} <= {200, 500}, {r.code for r in replies}
        assert wait_for(lambda: all(gone(victim) for victim in victims))
        after = pub.publish("/crash", "after")
        assert after.code == 200, after
        assert broker.alive()
        assert not set(storage_pids(broker.proc.pid)) & set(victims)
        # Their successors are started with python -m (the forked ones were the first).
        assert wait_for(lambda: len(storage_pids(broker.proc.pid)) == len(victims))
        assert set(storage_pids(broker.proc.pid)) <= logged_pids(broker.log(), "started"), \
            broker.log()
        confirmed = {smuid_of(r) for r in replies if r.code == 200} | {smuid_of(after)}
        received = set()
        while not confirmed <= received:
            msg = sub.message()
            received.add(int(header(msg, "Smuid").rsplit("/", 1)[1]))
            sub.ack()
    if any(r.code == 500 for r in replies):
        assert "storage process publish" in broker.log()


def test_storage_processes_end_with_their_listener(tmp_path):
    """kill -9 of the listener: its storage processes see their socket close and end (they
    would otherwise hold the database), and a new listener starts its own."""
    with fresh_listener("postgres", tmp_path) as broker:
        with Session(broker.host, broker.port, "root") as s:
            assert s.command("CREATE TOPIC /end").code == 200
            assert s.publish("/end", "E").code == 200
        children = storage_pids(broker.proc.pid)
        assert len(children) == 3  # two publish lanes and the ACK lane
        broker.proc.kill()
        broker.proc.wait()
        assert wait_for(lambda: all(gone(pid) for pid in children)), children
        again = start_listener(broker.env, broker.var_dir, name="again")
        try:
            with Session(again.host, again.port, "root") as s:
                assert s.publish("/end", "F").code == 200
        finally:
            stop_listener(again)


def test_without_storage_processes_the_threads_commit(tmp_path):
    """``SMQP_STORAGE_PROCESSES=0``: no child process; publish, NOTIFY and ACK work on the
    listener's own database threads."""
    with fresh_listener("sqlite", tmp_path, {"SMQP_STORAGE_PROCESSES": "0"}) as broker, \
            Session(broker.host, broker.port, "root") as sub, \
            Session(broker.host, broker.port, "root") as pub:
        assert pub.command("CREATE TOPIC /inline").code == 200
        assert sub.command("SUB MESSAGE /inline").code == 200
        smuid = smuid_of(pub.publish("/inline", "I"))
        assert header(sub.message(), "Smuid").endswith(f"/{smuid}")
        sub.ack()
        assert storage_pids(broker.proc.pid) == []


def test_a_session_reads_on_while_its_publishes_commit_and_answers_in_order(tmp_path):
    """While a publish waits for its commit (here: the test holds SQLite's write lock), the
    session reads on, its publish replies written by a task of their own: those replies,
    and that of a command sent between the publishes, still come in the order sent."""
    import sqlite3

    import dj_database_url

    with fresh_listener("sqlite", tmp_path) as broker, \
            Session(broker.host, broker.port, "root") as pub:
        assert pub.command("CREATE TOPIC /order").code == 200
        assert pub.publish("/order", "warm").code == 200
        lock = sqlite3.connect(dj_database_url.parse(broker.env["DATABASE_URL"])["NAME"],
                               isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # no commit gets through until we let it
        try:
            sent = []
            for i in range(5):
                pub.send_publish("/order", f"p{i}")
                sent.append(f"p{i}")
                if i == 2:
                    pub.sock.sendall(b"NOOP\r\n")
                    sent.append("NOOP")
                time.sleep(0.1)  # each arrives on its own
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        replies = [pub.reply() for _ in sent]
        assert [r.code for r in replies] == [200] * len(sent), replies
        # A publish's reply names its Cmuid; NOOP's is a bare OK.
        assert [r.lines for r in replies if len(r.lines) == 1] == [["OK"]]
        assert [r.lines[-1].split()[0] if len(r.lines) > 1 else "NOOP" for r in replies] == sent
        smuids = [smuid_of(r) for r, what in zip(replies, sent, strict=True) if what != "NOOP"]
        assert smuids == sorted(smuids)
