"""The storage process's own WAL flush (:func:`broker.store.worker.serve`), through its
socket, against a real SQLite database.

On SQLite with ``synchronous=FULL`` the storage process commits with NORMAL and flushes the
WAL itself before it answers a publish. The tests speak the lane protocol to a real
``broker.services.storage_calls`` process whose ``os.fdatasync`` waits for the test's word,
so they can see what is answered before the flush and what only after it.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import dj_database_url
import pytest

from broker.services.ack import AckRequest
from broker.services.publish import Published, PublishRequest
from broker.smqp.message import DataSection, Message
from broker.store.frames import LENGTH as _LENGTH
from broker.store.frames import take_frame
from broker.store.worker import LONG_CALL_BYTES
from tests.conftest import ROOT, accounts_script, fresh_database, run_manage
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

# The storage process, with os.fdatasync logging what it flushes and then waiting for one
# byte on the release pipe.
GATED = """
import os, sys
release, log = int(sys.argv[3]), sys.argv[4]
real = os.fdatasync
def gated(fd):
    with open(log, "a") as out:
        out.write(os.readlink(f"/proc/self/fd/{fd}") + "\\n")
    os.read(release, 1)
    real(fd)
os.fdatasync = gated
from broker.services.storage_calls import main
main(sys.argv[1:3])
"""


class Child:
    """A gated storage process and our end of its socket."""

    def __init__(self, env: dict[str, str], database: str, log: Path) -> None:
        self.sock, theirs = socket.socketpair()
        self.release_r, self.release_w = os.pipe()
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", GATED, str(theirs.fileno()), database,
             str(self.release_r), str(log)],
            pass_fds=(theirs.fileno(), self.release_r), env=env, cwd=ROOT)
        theirs.close()
        self.buffer = bytearray()

    def send(self, *calls: tuple[int, str, list]) -> None:
        """Calls in one write: the process finds them queued together."""
        frames = []
        for call_id, name, args in calls:
            data = pickle.dumps((call_id, name, args, (0, 0)))
            frames.append(_LENGTH.pack(len(data)) + data)
        self.sock.sendall(b"".join(frames))

    def answer(self, timeout: float) -> tuple | None:
        """The next answer (call id, ok, value), or None if none came within ``timeout``."""
        while (frame := take_frame(self.buffer)) is None:
            if not select.select([self.sock], [], [], scaled(timeout))[0]:
                return None
            data = self.sock.recv(1 << 20)
            assert data, "the storage process closed its socket"
            self.buffer += data
        return pickle.loads(frame)

    def release(self) -> None:
        os.write(self.release_w, b"x")

    def flushed(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def close(self) -> None:
        self.sock.close()
        self.release()  # a flush waiting for its word may go on, and the process end
        try:
            self.proc.wait(timeout=scaled(30))
        finally:
            os.close(self.release_r)
            os.close(self.release_w)


def publish(account_id: int, cmuid: str) -> PublishRequest:
    return PublishRequest(account_id=account_id, guid="flush001", kind="MESSAGE",
                          topic="/flush", cmuid=cmuid,
                          message=Message([], [DataSection([("Content-Type", "text/plain")],
                                                           cmuid.encode())]))


@pytest.fixture
def child(tmp_path):
    with fresh_database("sqlite", tmp_path) as env:
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("root") + (
            "from ual.resolution import AccessSnapshot\n"
            "from broker.services.topics import create_topic\n"
            "from broker.services import subscriptions\n"
            "from broker.smqp.values import TopicPattern\n"
            "root = Account.objects.get(username='root')\n"
            "create_topic(AccessSnapshot(root), '/flush')\n"
            "subscriptions.subscribe(AccessSnapshot(root), 'MESSAGE',\n"
            "                        TopicPattern(base='/flush', wildcard=False))\n"))
        database = dj_database_url.parse(env["DATABASE_URL"])["NAME"]
        running = Child(env, database, tmp_path / "flushed.txt")
        try:
            yield running, database
        finally:
            running.close()


def test_a_publish_is_answered_after_the_wal_flush_and_an_ack_behind_it_is_not_held(child):
    proc, database = child
    root = sqlite3.connect(database).execute(
        "SELECT id FROM accounts_account WHERE username = 'root'").fetchone()[0]
    proc.release()  # the first flush may pass
    proc.send((1, "publish_batch", [[publish(root, "first")]]))
    call_id, ok, [first] = proc.answer(30)
    assert (call_id, ok) == (1, True) and isinstance(first, Published)
    assert proc.flushed() == [f"{database}-wal"]

    # A publish, and an ACK queued behind it: both commit, the ACK is answered at once, the
    # publish only once the flush that follows its commit has ended.
    proc.send((2, "publish_batch", [[publish(root, "second")]]),
              (3, "ack_batch", [[AckRequest(root, first.smuid, 1, receipt=False)]]))
    call_id, ok, value = proc.answer(30)
    assert (call_id, ok, value) == (3, True, [])
    assert proc.answer(0.5) is None  # the flush waits for our word: no answer before it
    assert len(proc.flushed()) == 2
    with sqlite3.connect(database) as db:  # committed (NORMAL), only not yet flushed
        assert db.execute("SELECT count(*) FROM broker_message WHERE cmuid = 'second'"
                          ).fetchone()[0] == 1
    proc.release()
    call_id, ok, [second] = proc.answer(30)
    assert (call_id, ok) == (2, True) and isinstance(second, Published)
    assert second.smuid > first.smuid


def test_a_publish_is_answered_before_a_long_batch_behind_it_commits(child):
    """A large publish batch queued behind a publish whose answer waits for the flush:
    the flush and that answer go first, then the batch commits (a short call behind is
    committed first instead: see the test above)."""
    proc, database = child
    root = sqlite3.connect(database).execute(
        "SELECT id FROM accounts_account WHERE username = 'root'").fetchone()[0]

    def stored(prefix: str) -> int:
        with sqlite3.connect(database) as db:
            return db.execute("SELECT count(*) FROM broker_message WHERE cmuid LIKE ?",
                              (prefix + "%",)).fetchone()[0]

    batch = [publish(root, f"long{i:03d}" + "x" * 400) for i in range(100)]
    assert len(pickle.dumps(batch)) >= LONG_CALL_BYTES
    proc.send((1, "publish_batch", [[publish(root, "short")]]),
              (2, "publish_batch", [batch]))
    for _ in range(500):
        if proc.flushed():
            break
        assert proc.answer(0.01) is None
    # The flush for "short" has begun, before the long batch was committed.
    assert proc.flushed() == [f"{database}-wal"]
    assert stored("short") == 1
    assert stored("long") == 0
    proc.release()
    call_id, ok, [short] = proc.answer(30)
    assert (call_id, ok) == (1, True) and isinstance(short, Published)
    for _ in range(500):
        if len(proc.flushed()) == 2:
            break
        assert proc.answer(0.01) is None
    assert stored("long") == 100
    proc.release()
    call_id, ok, results = proc.answer(30)
    assert (call_id, ok) == (2, True)
    assert [r.smuid for r in results] == list(range(short.smuid + 1, short.smuid + 101))


def test_a_failed_call_is_answered_without_waiting_for_a_flush(child):
    proc, _ = child
    # Nothing was committed for it (the flush would wait for our word: it never gets it).
    proc.send((7, "no_such_call", []))
    call_id, ok, value = proc.answer(30)
    assert (call_id, ok) == (7, False) and isinstance(value, KeyError)
    assert proc.flushed() == []


async def test_the_listener_matches_answers_to_calls_by_number_not_order():
    """Answers may come back in another order than the calls went (an ACK's before the
    publish's that waits for its flush): each call gets its own."""
    import asyncio

    from broker.store.lanes import Lane, _Reader

    loop = asyncio.get_running_loop()
    lane = Lane("test", "unused")
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    lane._transport, _ = await loop.create_connection(lambda: _Reader(lane), sock=ours)
    first = asyncio.ensure_future(lane.call("publish_batch", "P"))
    second = asyncio.ensure_future(lane.call("ack_batch", "A"))
    received, calls = bytearray(), []
    while len(calls) < 2:
        received += await loop.sock_recv(theirs, 1 << 16)
        while (frame := take_frame(received)) is not None:
            calls.append(pickle.loads(frame))
    (p_id, p_name, p_args, _), (a_id, a_name, a_args, _) = calls
    assert (p_name, p_args, a_name, a_args) == ("publish_batch", ("P",), "ack_batch", ("A",))
    for answer in ((a_id, True, "ack answer"), (p_id, False, ValueError("publish answer"))):
        data = pickle.dumps(answer)
        await loop.sock_sendall(theirs, _LENGTH.pack(len(data)) + data)
    assert await second == "ack answer"
    with pytest.raises(ValueError, match="publish answer"):
        await first
    lane.close()
    theirs.close()


def test_ready_is_answered_once_the_process_serves_and_needs_no_flush(child):
    """The listener asks ``ready`` before it serves (its storage processes load Django
    first). The answer commits nothing, so it does not wait for a WAL flush."""
    proc, _ = child
    proc.send((1, "ready", []))
    assert proc.answer(60) == (1, True, None)
    assert proc.flushed() == []
