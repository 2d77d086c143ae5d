"""The per-process dispatcher: the one object the doors' sessions talk to.

Every listener process has one :class:`Dispatcher` (per event loop). It keeps the live
subscriber sessions by account and offers them what was committed, and composes the parts
that each do one job:

- :mod:`.commit`: the group commit. Publishes and ACKs from all sessions queue there and go
  to the database in batches (run in the storage processes); a publish is answered, an ACK
  recorded (in the ACK journal, or by its batch's commit) only then.
- :mod:`.wakeups`: wake-ups and presence. After each commit the new messages are offered to
  the sessions of this process directly, and told to other processes through the Channels
  layer: one wake-up per topic per batch on the group ``smqp-dispatch``.
- :mod:`.sweeps`: the backlog and subscription sweeps, by the clock.
- :mod:`.cache`: committed messages kept for NOTIFY, delivery policies, subscribe rights.
- :mod:`.health`: the operators' counters and this listener's health, flushed to Redis.

Queue-mode topics (profile §9.6) take another path: a message is locked to the session
before its NOTIFY, and its ACK is decided against that lock in the database at once
(:mod:`broker.services.locks`), not journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from django.conf import settings

from broker.domain.message import Message
from broker.services import conflict, locks, notify
from broker.services.ack import AckRequest, ack_batch, mark_dead
from broker.services.locks import LockAck, LockTake
from broker.services.publish import Published, PublishRequest
from broker.services.read import DeliveryPolicy
from broker.store import dbthread, journal, opsmetrics
from broker.store.lanes import Storage

from . import wakeups
from .cache import PayloadCache
from .claims import Claims, LockCommit
from .commit import CATCH_UP_SECONDS, GroupCommit
from .health import HealthReport, process_role
from .mailbox import Mailbox
from .sweeps import Sweeps
from .wakeups import WakeUps

__all__ = ["Dispatcher", "Session", "get_dispatcher", "process_role", "recover_journals",
           "shutdown"]

# Longest a door's first session waits for the storage processes (Dispatcher.storage_ready).
STORAGE_READY_SECONDS = 5.0
# How long an ACK by a session of this process keeps the message from being offered to its
# account again here, and at most how many are kept (see Dispatcher.offer).
RECENT_ACK_SECONDS = 60.0
RECENT_ACK_MAX = 100_000
# Late wake-ups (see Dispatcher.offer) are logged once per this many seconds at most.
LATE_LOG_SECONDS = 10.0

logger = logging.getLogger("broker.delivery")


class Session(Protocol):
    """A subscriber session of any door, as the dispatcher sees it: messages are offered to
    its mailbox, and the door is kicked when the mailbox says it has something to send."""

    account_id: int
    mailbox: Mailbox
    #: The logged-in session (accounts.models.LoginSession; None before login or after it
    #: ended): its guid names the session's counters.
    session: Any

    @property
    def idle(self) -> bool:
        """Its mailbox is idle and the session is not closing (the backlog sweep asks)."""
        ...

    def kick(self) -> None:
        """Start sending what the mailbox holds, unless the door is busy or paused."""
        ...


class Dispatcher:
    """The sessions of this process by account, what they ACKed lately, and the doors'
    waiters; the parts above do the rest, each wired to the others through this object."""

    def __init__(self) -> None:
        self.origin = uuid.uuid4().hex
        self.sessions: dict[int, set[Session]] = defaultdict(set)
        # When each session became live here (wall clock, as another process's wake-up is
        # stamped): see offer().
        self._live_since: dict[Session, float] = {}
        self._late = 0  # late wake-ups not logged yet
        self._late_logged = 0.0
        # (account, smuid) ACKed here lately → when to forget it (see offer()).
        self._recent_acks: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._watchers: defaultdict[int, set[Callable[[], None]]] = defaultdict(set)
        self.cache = PayloadCache()
        # The operators' console and /metrics (broker/store/opsmetrics.py).
        self.metrics = opsmetrics.Recorder()
        self.commits = GroupCommit(self.metrics, self.wake, self.cache.remember,
                                   self._acked_here)
        self.wakeups = WakeUps(self.origin, self.offer, self.withdraw)
        self.report = HealthReport(self.origin, self.sessions, self.metrics, self.commits)
        self.sweeps = Sweeps(self.sessions, self.backlog,
                             first_sweep=wakeups.PEER_STARTUP_SECONDS)
        self.claims = Claims(asyncio.get_running_loop().time)
        self.lock_commit = LockCommit(self._settle_locks, self.wake)
        self._storage_ready: asyncio.Future[None] | None = None

    @property
    def storage(self) -> Storage:
        """The storage processes the group commit runs in (:mod:`broker.store.lanes`)."""
        return self.commits.storage

    async def storage_ready(self, timeout: float = STORAGE_READY_SECONDS) -> None:
        """Returns once the storage processes serve (at most ``timeout`` seconds; then the
        first batch waits for them). For a door whose process did not wait for them at its
        start (XMPP in Daphne, where the dispatcher begins with the first stream): they load
        Django first, seconds on a busy machine, and a fan-out item written meanwhile had
        its ACK queued that long; a PostgreSQL failover then found it pending, and another
        node sent it again (issue 37)."""
        if self._storage_ready is None:
            self._storage_ready = asyncio.ensure_future(self.storage.ready())
        # Waiting is the point, not the outcome: a storage process that fails to start is
        # started again by the first batch, which says what went wrong.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._storage_ready), timeout)

    # ------------------------------------------------------------------ sessions

    def register(self, session: Session) -> None:
        self.sessions[session.account_id].add(session)
        self._live_since[session] = time.time()

    def unregister(self, session: Session) -> None:
        self._live_since.pop(session, None)
        live = self.sessions.get(session.account_id)
        if live is not None:
            live.discard(session)
            if not live:
                del self.sessions[session.account_id]

    def watch(self, account_id: int, wake: Callable[[], None]) -> None:
        """Call ``wake`` (on this loop) whenever a message is offered to the account: a
        door's waiter that is not a session (a REST long poll). Call from the loop only."""
        self._watchers[account_id].add(wake)

    def unwatch(self, account_id: int, wake: Callable[[], None]) -> None:
        watchers = self._watchers.get(account_id)
        if watchers is not None:
            watchers.discard(wake)
            if not watchers:
                del self._watchers[account_id]

    def offer(self, items: Iterable[tuple[int, int, Iterable[int]]],
              sent_at: float | None = None) -> None:
        """(priority, smuid, accounts) → each live session of those accounts, but for an
        account a session here has ACKed it for lately. A wake-up may come after the ACK: a
        backlog read (a login's, the sweep's) sees a message once it is committed, and may
        offer it before its publish has been answered here; the subscriber may ACK it
        before the publish's wake-up comes.

        ``sent_at``: when another process sent this wake-up (its wall clock; None for this
        process's own commits). Such a wake-up may come after the account ACKed the message
        on another node, which this process does not hear of, and a message is never
        delivered to an account again once ACKed (profile §8). So it is live only for the
        sessions that were live here when it was sent: one that logged in later read the
        store after the commit. And one that comes more than SMQP_WAKEUP_MAX_AGE_SECONDS
        after it was sent (a node cut off from Redis is handed what queued up for it once
        its link is back) is not trusted at all: the store is read for its accounts."""
        recent = self._recent_acks
        watchers = self._watchers
        late = (sent_at is not None
                and time.time() - sent_at > settings.SMQP_WAKEUP_MAX_AGE_SECONDS)
        read: set[int] = set()
        for priority, smuid, accounts in items:
            for account_id in accounts:
                for wake in tuple(watchers.get(account_id, ())):
                    wake()
                if late:
                    read.add(account_id)
                    continue
                if recent and (account_id, smuid) in recent:
                    continue
                for session in tuple(self.sessions.get(account_id, ())):
                    if sent_at is not None and self._live_since.get(session, 0.0) > sent_at:
                        continue
                    if session.mailbox.offer(priority, smuid, live=True):
                        session.kick()
        if late:
            self._came_late(sent_at, read)

    def _came_late(self, sent_at: float, accounts: set[int]) -> None:
        self._late += 1
        now = time.time()
        if now - self._late_logged >= LATE_LOG_SECONDS:
            logger.warning("%d wake-up(s) from other processes came late (the last %.1f s "
                           "after it was sent): the store is read for their accounts instead",
                           self._late, now - sent_at)
            self._late, self._late_logged = 0, now
        self.sweeps.read_soon(accounts)  # (it reads for those with a session here then)

    def withdraw(self, items: Iterable[tuple[int, int]]) -> None:
        """(account, smuid): queue-mode deliveries the store moved away from the account; its
        sessions here do not try them (see :func:`broker.services.notify.deliveries_withdrawn`)."""
        for account_id, smuid in items:
            for session in self.sessions.get(account_id, ()):
                session.mailbox.withdraw(smuid)

    def _acked_here(self, request: AckRequest) -> None:
        recent = self._recent_acks
        now = asyncio.get_running_loop().time()
        key = (request.account_id, request.smuid)
        recent[key] = now + RECENT_ACK_SECONDS
        recent.move_to_end(key)
        while recent and (len(recent) > RECENT_ACK_MAX or next(iter(recent.values())) < now):
            recent.popitem(last=False)

    # ------------------------------------------------------------------ publish / ack

    def publish(self, request: PublishRequest) -> asyncio.Future[Published]:
        """Queue for the next group commit; the future is done once the message is committed
        (a plain future: a session with many publishes in flight keeps no task for each)."""
        return self.commits.publish(request)

    async def ack(self, request: AckRequest, session: Session | None = None,
                  written: bool = False) -> None:
        """Record an ACK (``session``'s, if a session's); returns once it is recorded, so that
        ``310 ACK`` may go: appended to the journal (and flushed, with
        ``SMQP_ACK_DURABILITY=full``), the database following in the next ACK batch; without
        a journal, once that batch committed (``written``: the door's write delivered it,
        and it is retried until it commits: :meth:`.commit.GroupCommit.ack`). The account's
        other sessions here then no longer send it."""
        if (request.account_id, request.smuid) in self._recent_acks:
            # Recorded already for the account (another of its live sessions got it too):
            # the delivery is ACKed once, and its usage event is logged once.
            await self.commits.durable()
            return
        await self.commits.ack(request, written)  # (it calls _acked_here once recorded)
        self._forget_elsewhere(request, session)

    def _forget_elsewhere(self, request: AckRequest, session: Session | None,
                          live_too: bool = False) -> None:
        """An ACK recorded: the account's other sessions skip the message if it waits there
        (one already on its way there still goes); a fan-out message offered to them live
        still goes to each (profile §8), unless ``live_too`` (a queue message consumed)."""
        for other in self.sessions.get(request.account_id, ()):
            if other is not session:
                other.mailbox.forget(request.smuid, live_too=live_too)

    async def caught_up(self, timeout: float = CATCH_UP_SECONDS) -> None:
        """Returns once every ACK journaled until now is in the database (at most
        ``timeout`` seconds): see :meth:`.commit.GroupCommit.caught_up`."""
        await self.commits.caught_up(timeout)

    async def backlog(self, account_ids: list[int]) -> tuple[list[tuple[int, int, int]], bool]:
        """(account, priority, smuid) of what the store holds for these accounts, and
        whether a page was full; without what was ACKed here and may not have reached the
        database when the query read it (:meth:`.commit.GroupCommit.backlog`)."""
        return await self.commits.backlog(account_ids)

    # ------------------------------------------------------------------ wake-ups

    def wake(self, published: list[Published]) -> None:
        """Offer committed messages here, and tell the other processes (:mod:`.wakeups`)."""
        self.wakeups.wake(published)

    async def joined(self) -> None:
        """Returns once this process reads the dispatch group (or after a short while): a
        session reads its backlog after that, so what is committed later reaches it."""
        await self.wakeups.joined()

    # ------------------------------------------------------------------ message payloads

    async def load(self, smuid: int) -> tuple[str, str, Message] | None:
        """(topic path, Cmuid header, codec message) of a message, from memory or the store."""
        return await self.cache.load(smuid)

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        """(retry timeout seconds, max retries, queue mode) of a topic, cached for a few
        seconds."""
        return await self.cache.retry_policy(topic_path)

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        """May the message still go to the account (its subscribe right may have been
        revoked)? See :meth:`.cache.PayloadCache.deliverable`."""
        return await self.cache.deliverable(account_id, smuid, topic_path)

    async def dead(self, account_id: int, smuid: int) -> None:
        """The account's maximum retries are spent for this message."""
        await dbthread.run(mark_dead, [(account_id, smuid)])

    # ------------------------------------------------------------------ queue-mode locks

    async def lock(self, account_id: int, session_guid: str, smuid: int,
                   policy: DeliveryPolicy) -> bool:
        """Queue mode: lock the message to the session before its NOTIFY; False when the
        session may not send it (another session here claimed it, another account's turn
        now, locked by another session, retries spent, gone). See :mod:`.claims`."""
        key = (account_id, smuid)
        if not self.claims.claim(key, session_guid, policy.retry_timeout):
            return False
        try:
            won = await self.lock_commit.take(LockTake(account_id, session_guid, smuid,
                                                       policy.retry_timeout,
                                                       policy.max_retries))
        except BaseException:
            self.claims.drop(key, session_guid)
            raise
        if not won:
            self.claims.drop(key, session_guid)
        return won

    async def ack_locked(self, request: AckRequest, session_guid: str,
                         session: Session | None = None) -> None:
        """Queue mode: the ACK of the lock's holder, decided in the database at once (no
        journal: it must be weighed against the lock); ServiceError 409 when the session no
        longer holds the lock, and nothing changed. The account's other sessions here then
        no longer send it."""
        key = (request.account_id, request.smuid)
        try:
            consumed = await self.lock_commit.ack(LockAck(
                request.account_id, session_guid, request.smuid, request.receipt,
                request.door))
        finally:
            self.claims.drop(key, session_guid)
        if not consumed:
            raise conflict("lock not held")
        self.metrics.count("ack")
        self._acked_here(request)
        self._forget_elsewhere(request, session, live_too=True)

    async def release(self, account_id: int, session_guid: str,
                      smuids: list[int] | None = None, unsent: Iterable[int] = ()) -> None:
        """Queue mode: the session's locks (all, or those on ``smuids``) end now; their
        messages are offered to the next subscriber, here and in every process. Those of
        ``unsent`` were never written to the session: their attempts are given back."""
        self.claims.drop_holder(
            session_guid, None if smuids is None else [(account_id, m) for m in smuids])
        await self.lock_commit.settled()  # after the locks it took, never before one
        self.wake(await dbthread.run(locks.release, account_id, session_guid, smuids,
                                     list(unsent)))

    @staticmethod
    async def _settle_locks(takes: list[LockTake], acks: list[LockAck]
                            ) -> tuple[list[bool], list[bool], list[Published]]:
        return await dbthread.run(locks.settle, takes, acks)

    # ------------------------------------------------------------------ operators' counters

    def health(self) -> dict:
        """This listener as the operators' console shows it (opsmetrics.listeners())."""
        return self.report.health()

    def unacked(self) -> dict[str, int]:
        """guid → messages sent to the session and not ACKed yet (its mailbox's one in
        flight, and the queue-mode locks it holds), for the operators' sessions list."""
        return self.report.unacked()

    async def flush_metrics(self) -> None:
        await self.report.flush()

    def close(self) -> None:
        self.lock_commit.close()
        self.wakeups.close()
        self.sweeps.close()
        self.report.close()
        self.commits.close()


_dispatchers: dict[asyncio.AbstractEventLoop, Dispatcher] = {}


def get_dispatcher() -> Dispatcher:
    """This event loop's dispatcher (created on first use)."""
    loop = asyncio.get_running_loop()
    dispatcher = _dispatchers.get(loop)
    if dispatcher is None:
        dispatcher = _dispatchers[loop] = Dispatcher()
    return dispatcher


async def shutdown(timeout: float) -> None:
    """At the listener's end: journaled ACKs reach the database (up to ``timeout``), then
    every dispatcher of this process stops."""
    for dispatcher in list(_dispatchers.values()):
        # Its sessions are closed: nothing is journaled any more. What did not reach the
        # database by then stays in the journal, for the next start to apply.
        await dispatcher.caught_up(timeout)
        await dispatcher.flush_metrics()
        dispatcher.close()
    _dispatchers.clear()


def recover_journals() -> int:
    """Apply the ACK journals of listeners that are gone (:func:`broker.store.journal.recover`)
    and offer the receipts that sends; the listener calls this before it serves, Celery beat
    periodically. Returns how many ACKs were applied."""

    def apply(records: list[journal.Record]) -> None:
        notify.messages_committed(ack_batch([AckRequest(*r) for r in records]))

    return journal.recover(journal.directory(), apply)

