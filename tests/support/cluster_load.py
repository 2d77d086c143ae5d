"""Load through HAProxy for the cluster tests: publishers that keep what the broker confirmed
(``200``), queue-mode and fan-out consumers that keep what they were sent and what was
answered ``310 ACK``; every client reconnects (to whichever node HAProxy picks) when its
connection breaks, and keeps going until told to stop."""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.support.queue_clients import ack_answer, smuid_in
from tests.support.smqp_session import Session
from tests.support.timing import scaled

RETRY = 5  # the queue topic's retry timeout (a dead session's lock ends after it)

SETUP = f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot

def account(name, **kw):
    a = Account.objects.filter(username=name).first()
    if a is None:
        a = Account(username=name, **kw)
        a.set_password('pw')
        a.save()
    return a

root = account('root', is_superuser=True, is_staff=True)
snap = AccessSnapshot(root)
for path in ('/jobs', '/fan'):
    if not Topic.objects.filter(path=path).exists():
        ts.create_topic(snap, path)
Topic.objects.filter(path='/jobs').update(delivery_mode='queue', retry_timeout={RETRY},
                                          max_retries=1000)
names = ['pub'] + [f'q{{i}}' for i in range(4)] + [f'f{{i}}' for i in range(2)] + \\
        [f'r{{i}}' for i in range(500)]
for name in names:
    a = account(name)
    for path, right in (('/jobs', 'publish'), ('/fan', 'publish'), ('/jobs', 'subscribe'),
                        ('/fan', 'subscribe')):
        t = Topic.objects.get(path=path)
        UALEntry.objects.get_or_create(topic=t, principal_kind='account', account=a,
                                       right=right)
"""


class Client(threading.Thread):
    def __init__(self, name: str, host: str, port: int, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.host, self.port, self.stop = host, port, stop
        self.reconnects = 0
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self.ready = threading.Event()

    def session(self, account: str) -> Session:
        while True:
            try:
                return Session(self.host, self.port, account, timeout=10)
            except (OSError, AssertionError) as exc:
                self.errors.append(repr(exc))
                if self.stop.is_set():
                    raise
                time.sleep(0.5)

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the test
            if not self.stop.is_set():
                self.failure = exc
        finally:
            self.ready.set()


class Publisher(Client):
    """Publishes ``<topic>`` messages one at a time; ``confirmed`` holds the smuid of each
    answered 200 (a publish whose answer was lost is not counted either way)."""

    def __init__(self, name, host, port, stop, topics=("/jobs", "/fan"), pause=0.0):
        super().__init__(name, host, port, stop)
        self.topics = topics
        self.pause = pause
        self.confirmed: dict[str, list[int]] = {t: [] for t in topics}
        self.attempts = 0

    def work(self) -> None:
        s = self.session("pub")
        self.ready.set()
        n = 0
        while not self.stop.is_set():
            topic = self.topics[n % len(self.topics)]
            n += 1
            self.attempts += 1
            try:
                reply = s.publish(topic, f"{self.name}-{n}")
            except (OSError, ConnectionError, AssertionError) as exc:
                self.errors.append(repr(exc))
                s.close()
                self.reconnects += 1
                s = self.session("pub")
                continue
            if reply.code == 200:
                self.confirmed[topic].append(int(reply.lines[-1].split()[-1]))
            else:  # "store unavailable" during a failover: said, not confirmed
                self.errors.append(f"{reply.code}")
                time.sleep(0.2)
            if self.pause:
                time.sleep(self.pause)
        s.close()


class Consumer(Client):
    """SUB MESSAGE ``topic`` as ``account``; every NOTIFY MESSAGE answered 310 ACK."""

    def __init__(self, name, host, port, stop, account: str, topic: str):
        super().__init__(name, host, port, stop)
        self.account, self.topic = account, topic
        self.notified: list[int] = []
        self.acked: list[int] = []
        # len(acked) at each (re)connection, and the greeting's server: a failure names
        # the sessions that ACKed a message twice.
        self.sessions: list[tuple[int, str]] = []

    def connect(self) -> Session:
        while True:
            s = self.session(self.account)
            self.sessions.append((len(self.acked), s.greeting.ident))
            try:
                reply = s.command(f"SUB MESSAGE {self.topic}")
            except (OSError, ConnectionError) as exc:
                self.errors.append(repr(exc))
                s.close()
                continue
            if reply.code == 200:
                return s
            self.errors.append(f"SUB {reply.code}")
            s.close()
            time.sleep(0.5)

    def work(self) -> None:
        s = self.connect()
        self.ready.set()
        while not self.stop.is_set():
            try:
                try:
                    note = s.message(timeout=0.5)
                except TimeoutError:
                    continue
                smuid = smuid_in(note)
                self.notified.append(smuid)
                if ack_answer(s) == 310:
                    self.acked.append(smuid)
            except (OSError, ConnectionError, AssertionError) as exc:
                self.errors.append(repr(exc))
                s.close()
                self.reconnects += 1
                s = self.connect()
        s.close()


def check(failures: list[BaseException | None]) -> None:
    for failure in failures:
        if failure is not None:
            raise failure


def acked_in_store(database_url: str, smuids: set[int]) -> dict[int, list[str]]:
    """Which accounts' deliveries of ``smuids`` the store holds as ACKED."""
    import psycopg

    out: dict[int, list[str]] = {}
    with psycopg.connect(database_url, connect_timeout=int(scaled(5))) as db:
        rows = db.execute(
            "SELECT d.message_id, a.username FROM broker_delivery d JOIN accounts_account a "
            "ON a.id = d.account_id WHERE d.state = 'acked' AND d.message_id = ANY(%s)",
            (list(smuids),)).fetchall()
    for smuid, account in rows:
        out.setdefault(smuid, []).append(account)
    return out


def wait_drained(database_url: str, publishers: list[Publisher], queue: list[Consumer],
                 fan: list[Consumer], timeout: float) -> float:
    """Until every confirmed /jobs message was delivered to a queue consumer and ACKed, and
    every confirmed /fan one to each fan-out consumer; the seconds it took. ACKED is read
    from the store: a node may die between an ACK's commit and its 310 reply."""
    started = time.monotonic()
    jobs = {m for p in publishers for m in p.confirmed.get("/jobs", [])}
    fans = {m for p in publishers for m in p.confirmed.get("/fan", [])}
    while True:
        check([c.failure for c in queue + fan])
        try:
            store = acked_in_store(database_url, jobs | fans)
        except Exception:  # a database failover in progress: ask again
            store = {}
        missing_jobs = {m for m in jobs if not store.get(m)}
        missing_fan = [{m for m in fans if c.account not in store.get(m, [])} for c in fan]
        if not missing_jobs and not any(missing_fan):
            notified = {m for c in queue for m in c.notified}
            assert jobs <= notified, f"ACKED but never sent: {sorted(jobs - notified)[:20]}"
            for c in fan:
                assert fans <= set(c.notified), f"{c.account}: ACKED but never sent"
            return time.monotonic() - started
        if time.monotonic() - started > scaled(timeout):
            raise AssertionError(f"not drained in {scaled(timeout)} s: {len(missing_jobs)} queue "
                                 f"messages not ACKED, e.g. {sorted(missing_jobs)[:20]}; "
                                 f"fan-out {[len(m) for m in missing_fan]}")
        time.sleep(0.5)


def assert_exactly_once(queue: list[Consumer], fan: list[Consumer]) -> None:
    """No message answered 310 ACK twice: once across the queue consumers, once per
    fan-out consumer."""
    twice = [m for m, n in Counter(m for c in queue for m in c.acked).items() if n > 1]
    assert not twice, f"queue messages ACKed twice: {twice[:20]}"
    for c in fan:
        twice = [m for m, n in Counter(c.acked).items() if n > 1]
        assert not twice, (f"{c.account}: fan-out messages ACKed twice: {twice[:20]}; at "
                           f"{[i for i, m in enumerate(c.acked) if m == twice[0]]} of "
                           f"{len(c.acked)} ACKs; sessions (from ACK, greeting): {c.sessions}")
