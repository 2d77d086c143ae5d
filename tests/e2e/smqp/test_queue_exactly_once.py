"""Issue 22 item 2, the acceptance run: queue mode consumes every message exactly once across
processes (profile §9.6), on SQLite and PostgreSQL.

One database; two ``runsmqp`` listener processes on it; a real Celery worker with beat (the
lock deadline and waiting-delivery sweeps every second); a queue topic with a 2 s retry
timeout and retries enough that nothing dies; two subscriber accounts, bob on one listener
and alice on the other. 2,000 messages are published (half through each listener) while the
subscribers' client threads ACK most messages at once, hold some ACKs past the lock's
deadline (each answered 409), and now and then drop the connection without QUIT while a
message waits for their ACK (and log in again). At the end every message was answered
``310 ACK`` exactly once across the clients, and the store holds exactly one delivery per
message, ACKED. The counts are printed (``-s``) for the record."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    accounts_script,
    fresh_database,
    listener,
    run_manage,
    stop_process,
)
from tests.support.queue_clients import ack_answer, smuid_in, store_rows
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

MESSAGES = 2000
RETRY = 2  # the topic's retry timeout: a lock's deadline, seconds
DELAY_EVERY = 150  # each subscriber holds the ACK of every n-th message it gets past it
KILL_EVERY = 230  # ... and drops its connection at every n-th one (not a delayed one)
PUBLISH_CHUNK = 100  # publishes sent before their replies are read
ALL_ACKED_WITHIN = 90.0  # seconds: a bound on the run, not a timing assertion

SETUP = f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), '/jobs')
Topic.objects.filter(path='/jobs').update(delivery_mode='queue', retry_timeout={RETRY},
                                          max_retries=1000)
jobs = Topic.objects.get(path='/jobs')
for name in ['bob', 'alice']:
    UALEntry.objects.create(topic=jobs, principal_kind='account',
                            account=Account.objects.get(username=name), right='subscribe')
"""


class Subscriber(threading.Thread):
    """One subscriber account's client: NOTIFY in, 310 ACK out, with delayed ACKs and dropped
    connections along the way. What each ACK was answered is kept for the counts."""

    def __init__(self, name: str, host: str, port: int, stop: threading.Event) -> None:
        super().__init__(name=f"subscriber-{name}", daemon=True)
        self.account, self.host, self.port, self.stop = name, host, port, stop
        self.subscribed = threading.Event()
        self.notified: list[int] = []
        self.acked: list[int] = []  # answered 310 ACK
        self.conflicts = 0  # answered 409
        self.delayed: list[int] = []  # answers to the ACKs held past the deadline
        self.kills = 0
        self.failure: BaseException | None = None

    def connect(self) -> Session:
        session = Session(self.host, self.port, self.account)
        assert session.command("SUB MESSAGE /jobs").code == 200
        return session

    def run(self) -> None:
        try:
            self._consume()
        except BaseException as exc:  # reported by the test
            self.failure = exc
            self.subscribed.set()

    def _consume(self) -> None:
        session = self.connect()
        self.subscribed.set()
        try:
            while not self.stop.is_set():
                try:
                    note = session.message(timeout=0.5)
                except TimeoutError:
                    continue
                smuid = smuid_in(note)
                self.notified.append(smuid)
                count = len(self.notified)
                if count % KILL_EVERY == 0:
                    session.close()  # no QUIT, the message not ACKed: its lock ends now
                    self.kills += 1
                    session = self.connect()
                    continue
                delayed = count % DELAY_EVERY == 0
                if delayed:
                    time.sleep(scaled(RETRY + 0.5))
                answer = ack_answer(session)
                if delayed:
                    self.delayed.append(answer)
                if answer == 310:
                    self.acked.append(smuid)
                elif answer == 409:
                    self.conflicts += 1
                else:
                    raise AssertionError(f"310 ACK of {smuid} answered {answer}")
        finally:
            session.close()


@contextmanager
def celery_worker(env: dict[str, str], var: Path):
    """A Celery worker with beat (the sweeps), its log in ``var``."""
    log_path = var / "celery.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "broker", "worker", "-B", "--loglevel",
             "INFO", "--concurrency", "1", "--schedule", str(var / "beat-schedule")],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield log_path
        finally:
            stop_process(worker, timeout=30)


def publish_all(publishers: list[Session]) -> list[int]:
    """MESSAGES publishes to /jobs, a chunk through each publisher in turn (pipelined)."""
    smuids: list[int] = []
    for chunk in range(MESSAGES // PUBLISH_CHUNK):
        pub = publishers[chunk % len(publishers)]
        for i in range(PUBLISH_CHUNK):
            pub.send_publish("/jobs", f"J{chunk * PUBLISH_CHUNK + i}")
        smuids.extend(smuid_of(pub.reply()) for _ in range(PUBLISH_CHUNK))
    return smuids


def swept(log: str, task: str) -> int:
    """What the Celery task's runs returned, summed (how many deliveries it moved)."""
    return sum(int(n) for n in re.findall(
        rf"Task broker\.{task}\[[^\]]+\] succeeded in [\d.]+s: (\d+)", log))


@pytest.mark.timeout(300)  # some 40 s each on an idle machine; room for a busy one
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_queue_message_is_consumed_exactly_once_across_processes(backend, tmp_path):
    extra = {"SMQP_REQUEUE_SWEEP_SECONDS": "1", "SMQP_BACKLOG_SWEEP_SECONDS": "2"}
    with fresh_database(backend, tmp_path, extra) as env:
        run_manage(env, "shell", "--no-imports", "-c",
                   accounts_script("root", "bob", "alice") + SETUP)
        with listener(env, tmp_path, name="one") as one, \
                listener(env, tmp_path, name="two") as two, \
                celery_worker(env, tmp_path) as celery_log:
            stop = threading.Event()
            subscribers = [Subscriber("bob", one.host, one.port, stop),
                           Subscriber("alice", two.host, two.port, stop)]
            for s in subscribers:
                s.start()
                assert s.subscribed.wait(scaled(30)) and s.failure is None, s.failure
            try:
                with Session(one.host, one.port, "root") as p1, \
                        Session(two.host, two.port, "root") as p2:
                    started = time.monotonic()
                    published = publish_all([p1, p2])
                deadline = started + ALL_ACKED_WITHIN
                while time.monotonic() < deadline and not any(s.failure for s in subscribers):
                    if len({m for s in subscribers for m in s.acked}) >= len(published):
                        break
                    time.sleep(0.2)
                elapsed = time.monotonic() - started
                time.sleep(scaled(RETRY + 1))  # a message consumed twice would show by now
            finally:
                stop.set()
                for s in subscribers:
                    s.join(timeout=scaled(30))
            logs = one.log() + two.log()
            assert "Traceback" not in logs, logs[-5000:]
            sweeps_log = celery_log.read_text()
        for s in subscribers:
            assert s.failure is None, s.failure

        acks = Counter(m for s in subscribers for m in s.acked)
        deliveries = store_rows(env, (
            "SELECT d.message_id, d.state, d.attempts FROM broker_delivery d "
            "JOIN broker_message m ON m.id = d.message_id "
            "JOIN topics_topic t ON t.id = m.topic_id WHERE t.path = '/jobs'"))
        rows_per_message = Counter(m for m, _, _ in deliveries)
        states = Counter(state for _, state, _ in deliveries)
        attempts = sum(a for _, _, a in deliveries)
        stored = store_rows(env, "SELECT COUNT(*) FROM broker_message m JOIN topics_topic t "
                                 "ON t.id = m.topic_id WHERE t.path = '/jobs'")[0][0]
        conflicts = sum(s.conflicts for s in subscribers)
        held = sum(len(s.delayed) for s in subscribers)
        print(f"\n[{backend}] published {len(published)}, stored {stored}; "
              f"310 ACK {sum(acks.values())} ({len(acks)} distinct), 409 {conflicts} "
              f"(of them ACKs held past the deadline: {held}); "
              f"NOTIFY {sum(len(s.notified) for s in subscribers)}; "
              f"connections dropped {sum(s.kills for s in subscribers)}; "
              f"locks taken {attempts} ({attempts - len(published)} beyond one per message); "
              f"moved by the sweeps: waiting {swept(sweeps_log, 'requeue_queue_deliveries')}, "
              f"lock deadlines {swept(sweeps_log, 'expire_queue_locks')}; "
              f"per account {[(s.account, len(s.acked)) for s in subscribers]}; "
              f"{elapsed:.1f} s")
        # Every message ACKed exactly once at the clients, and in the store.
        assert len(set(published)) == MESSAGES == stored
        assert set(acks) == set(published)
        assert set(acks.values()) == {1}
        assert set(rows_per_message) == set(published)
        assert set(rows_per_message.values()) == {1}
        assert states == {"acked": MESSAGES}
        # An ACK held past its lock's deadline is refused, and the message went elsewhere.
        assert all(answer == 409 for s in subscribers for answer in s.delayed)
        assert all(s.delayed and s.kills for s in subscribers)
