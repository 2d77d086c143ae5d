"""The per-process dispatcher: group commit of publishes and ACKs, and wake-ups.

Every listener process has one :class:`Dispatcher` (per event loop). Publishes and ACKs from
all sessions queue here; one writer task for each stores whatever has queued up in a single
transaction (so a burst of publishes costs one commit, not one each), and only then lets the
sessions answer ``200`` / ``310 ACK``. The commits run in storage processes
(:mod:`broker.store.lanes`), on PostgreSQL side by side, each on a connection of its own
(:func:`broker.store.dbthread.acks_apart`). After each commit it offers the
new messages to the subscribed sessions of this process directly, and to other processes
through the Channels layer: one wake-up per topic per batch on the group ``smqp-dispatch``.

ACKs are recorded in the listener's ACK journal (:mod:`broker.store.journal`) before ``310 ACK``
goes out, and reach the database in the ACK batches behind it (``SMQP_ACK_JOURNAL=0``: the
``310 ACK`` waits for the batch's commit instead).

Queue-mode topics (profile §9.6) take another path: a message is locked to the session
before its NOTIFY, and its ACK is decided against that lock in the database at once
(:mod:`broker.services.locks`), not journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import math
import os
import socket
import sys
import time
import uuid
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from broker.domain.message import DataSection, Message
from broker.services import ServiceError, locks, notify, read, storage_calls
from broker.services import subscriptions as subscription_service
from broker.services.ack import AckRequest, ack_batch, mark_dead
from broker.services.notify import DISPATCH_GROUP
from broker.services.publish import Published, PublishRequest
from broker.services.read import DeliveryPolicy
from broker.store import dbthread, journal, opsmetrics
from broker.store.lanes import Storage, StorageLost

from .linger import PublishLinger
from .mailbox import Mailbox

logger = logging.getLogger("broker.delivery")

# Loaded messages kept for NOTIFY (bytes of data held at most, roughly).
CACHE_BYTES = 64 * 1024 * 1024
# Largest group committed at once (bounded so one commit stays short).
MAX_BATCH = 2000
# Largest group of publishes committed at once while subscribers are ACKing (an ACK that
# arrives meanwhile waits for one such slice at most); with no ACK for a second, MAX_BATCH.
PUBLISH_SLICE = 64
ACKING_SECONDS = 1.0
# Bytes of message data committed at once at most (one message may be larger): a batch is
# held in memory once more on its way to the storage process.
MAX_BATCH_BYTES = 64 * 1024 * 1024
# How long "this account may receive from this topic" is trusted without asking again. With
# the UAL cache's own poll (0.5 s) a revoked right stops notifications within a second.
GRANT_MEMO_SECONDS = 0.2
# After a batch of cross-process wake-ups is sent, the next gathers for this long: under a
# stream of small commits the channel layer then costs a few hundred round trips a second at
# most, and another process hears of a message this much later at worst.
WAKE_GATHER_SECONDS = 0.005
# Wake-ups go to the other processes only while there are any: every dispatcher says hello
# on the dispatch group when it joins and every PEER_HELLO_SECONDS after, answers a hello
# from a process it did not know with its own at once, and forgets a process it has not
# heard from for PEER_FORGET_SECONDS. For its first PEER_STARTUP_SECONDS a dispatcher sends
# its wake-ups whether or not it has heard of another (their hellos are on their way). A
# listener alone (the common case) then spends nothing on wake-ups nobody reads. Another
# process learns of a new one a moment after it joined, by its hello: a commit there in
# that moment is not announced to it, and reaches its sessions by a backlog read (a
# dispatcher's first sweep comes PEER_STARTUP_SECONDS after it starts, not a period).
PEER_HELLO_SECONDS = 5.0
PEER_FORGET_SECONDS = 16.0
PEER_STARTUP_SECONDS = 2.0
# How long a login waits for its process to have joined the dispatch group (Redis slow or
# down: the login goes on, and the backlog sweep covers what a missed wake-up delays).
JOIN_WAIT_SECONDS = 1.0
# An ACK batch that failed to reach the database is tried again after this long (doubling
# up to ACK_RETRY_MAX): its ACKs are in the journal, and a restart would apply them too.
ACK_RETRY_SECONDS = 0.05
ACK_RETRY_MAX = 2.0
# Journaled ACKs (already recorded: 310 ACK went) reach the database in batches that start
# this long apart at most, unless a backlog read or the shutdown waits for them, or
# MAX_BATCH are queued: under a steady stream of ACKs, one transaction serves many instead
# of one each. A single ACK after a quiet spell goes at once. What waits meanwhile is only
# what the database learns later: the message's timeout and its receipt start this much
# later at worst.
ACK_GATHER_SECONDS = 0.05
# Longest a backlog read waits for the journaled ACKs to reach the database (caught_up()).
CATCH_UP_SECONDS = 5.0
# How often the operators' counters and this listener's health go to Redis (opsmetrics).
METRICS_FLUSH_SECONDS = 1.0
# How long an ACK by a session of this process keeps the message from being offered to its
# account again here, and at most how many are kept (see Dispatcher.offer).
RECENT_ACK_SECONDS = 60.0
RECENT_ACK_MAX = 100_000


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
    def __init__(self) -> None:
        self.origin = uuid.uuid4().hex
        self.sessions: dict[int, set[Session]] = defaultdict(set)
        self._publishes: list[tuple[PublishRequest, asyncio.Future]] = []
        self._publish_times: deque[float] = deque()  # when each of them was queued
        self._linger = PublishLinger(settings.SMQP_PUBLISH_LINGER_MS / 1000)
        self._linger_timer: asyncio.TimerHandle | None = None
        # ACKs for the next batch, each with the future its session awaits (None: journaled).
        self._acks: list[tuple[AckRequest, asyncio.Future | None]] = []
        self.journal = journal.AckJournal(journal.directory()) if settings.SMQP_ACK_JOURNAL \
            else None
        # (account, smuid) of ACKs made here → the number of the ACK batch that brought them
        # to the database (inf until then: journaled, or on their way without a journal);
        # see backlog().
        self.acked: dict[tuple[int, int], float] = {}
        self._batches_applied = 0
        self._applied_keys: deque[tuple[int, list[tuple[int, int]]]] = deque()
        self._reads: Counter[int] = Counter()  # backlog queries running, by their start mark
        # (account, smuid) ACKed here lately → when to forget it (see offer()).
        self._recent_acks: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._sync_waiters: list[asyncio.Future] = []
        self._watchers: defaultdict[int, set[Callable[[], None]]] = defaultdict(set)
        self._syncer: asyncio.Task | None = None
        # caught_up() callers: (journal records that must be applied, future).
        self._apply_waiters: list[tuple[int, asyncio.Future]] = []
        self._publish_work = asyncio.Event()
        self._ack_work = asyncio.Event()
        self._ack_hurry = asyncio.Event()  # set: end the ACK gathering pause now
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._policies: dict[str, tuple[float, DeliveryPolicy]] = {}
        self._grants: dict[tuple[int, str], float] = {}
        self._outgoing: defaultdict[int, list[list]] = defaultdict(list)
        self._sender: asyncio.Task | None = None
        self._committing: set[asyncio.Future] = set()
        self._last_ack = float("-inf")
        self._joined = asyncio.get_running_loop().create_future()
        # Other processes on the dispatch group: origin → when last heard of (loop time).
        self._peers: dict[str, float] = {}
        self._startup_until = asyncio.get_running_loop().time() + PEER_STARTUP_SECONDS
        self._greeter: asyncio.Task | None = None
        self.storage = Storage(storage_calls.LISTENER_SIDE)
        self.storage.start()
        self._writer = asyncio.ensure_future(self._publish_loop())
        self._acker = asyncio.ensure_future(self._ack_loop())
        self._listener = asyncio.ensure_future(self._listen_loop())
        self._sweeper = asyncio.ensure_future(self._sweep_loop())
        # The operators' console and /metrics (broker/store/opsmetrics.py).
        self.metrics = opsmetrics.Recorder()
        self._started_at = time.time()
        self._metrics_task = asyncio.ensure_future(self._metrics_loop())
        self._subscription_sweeper = asyncio.ensure_future(self._subscription_loop())

    # ------------------------------------------------------------------ sessions

    def register(self, session: Session) -> None:
        self.sessions[session.account_id].add(session)

    def unregister(self, session: Session) -> None:
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

    def offer(self, items: Iterable[tuple[int, int, Iterable[int]]]) -> None:
        """(priority, smuid, accounts) → each live session of those accounts, but for an
        account a session here has ACKed it for lately. A wake-up may come after the ACK: a
        backlog read (a login's, the sweep's) sees a message once it is committed, and may
        offer it before its publish has been answered here; the subscriber may ACK it
        before the publish's wake-up comes."""
        recent = self._recent_acks
        watchers = self._watchers
        for priority, smuid, accounts in items:
            for account_id in accounts:
                for wake in tuple(watchers.get(account_id, ())):
                    wake()
                if recent and (account_id, smuid) in recent:
                    continue
                for session in tuple(self.sessions.get(account_id, ())):
                    if session.mailbox.offer(priority, smuid, live=True):
                        session.kick()

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
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Published] = loop.create_future()
        now = loop.time()
        self._linger.arrived(now)
        self._publishes.append((request, future))
        self._publish_times.append(now)
        self._publish_work.set()
        return future

    async def ack(self, request: AckRequest, session: Session | None = None) -> None:
        """Record an ACK (``session``'s, if a session's); returns once it is recorded, so that
        ``310 ACK`` may go: appended to the journal (and flushed, with
        ``SMQP_ACK_DURABILITY=full``), the database following in the next ACK batch; without
        a journal, once that batch committed. The account's other sessions here then no
        longer send it."""
        if (request.account_id, request.smuid) in self._recent_acks:
            # Recorded already for the account (another of its live sessions got it too):
            # the delivery is ACKed once, and its usage event is logged once.
            if self.journal is not None and settings.SMQP_ACK_DURABILITY == "full":
                await self._synced()
            return
        if self.journal is None:
            future = asyncio.get_running_loop().create_future()
            # A backlog read running now may not see this ACK's commit: see backlog().
            self.acked[(request.account_id, request.smuid)] = math.inf
            self._acks.append((request, future))
            self._ack_work.set()
            await future
            self._acked_here(request)
            self._forget_elsewhere(request, session)
            return
        try:
            self.journal.append([(request.account_id, request.smuid, request.attempts,
                                  request.receipt, request.door)])
        except OSError as exc:
            logger.exception("writing the ACK journal failed")
            raise ServiceError(500, "Server error (ACK not recorded)") from exc
        self.acked[(request.account_id, request.smuid)] = math.inf
        self._acked_here(request)
        self._acks.append((request, None))
        self._ack_work.set()
        if len(self._acks) >= MAX_BATCH:
            self._ack_hurry.set()
        if settings.SMQP_ACK_DURABILITY == "full":
            await self._synced()
        self._forget_elsewhere(request, session)

    def _forget_elsewhere(self, request: AckRequest, session: Session | None,
                          live_too: bool = False) -> None:
        """An ACK recorded: the account's other sessions skip the message if it waits there
        (one already on its way there still goes); a fan-out message offered to them live
        still goes to each (profile §8), unless ``live_too`` (a queue message consumed)."""
        for other in self.sessions.get(request.account_id, ()):
            if other is not session:
                other.mailbox.forget(request.smuid, live_too=live_too)

    async def _synced(self) -> None:
        """Returns once the journal is on disk up to here: one fdatasync (on a thread)
        serves every ACK appended before it started."""
        future = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(future)
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.ensure_future(self._sync_loop())
        await future

    async def _sync_loop(self) -> None:
        assert self.journal is not None
        loop = asyncio.get_running_loop()
        while self._sync_waiters:
            waiters, self._sync_waiters = self._sync_waiters, []
            try:
                await loop.run_in_executor(None, self.journal.flusher())
            except OSError:
                logger.exception("flushing the ACK journal failed")
                outcome: BaseException | None = ServiceError(
                    500, "Server error (the ACK may have been recorded)")
            else:
                outcome = None
            for waiter in waiters:
                if waiter.done():
                    continue
                if outcome is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(outcome)

    async def _ack_loop(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            await self._ack_work.wait()
            self._ack_work.clear()
            while self._acks:
                started = self._last_ack = loop.time()
                acks = self._acks[:MAX_BATCH]
                del self._acks[:MAX_BATCH]
                if await self._commit_acks(acks) or self.journal is None:
                    failures = 0
                    if self.journal is not None:
                        await self._gather_acks(started + ACK_GATHER_SECONDS - loop.time())
                    continue
                # Journaled ACKs are not given up: they go again, first and in order.
                self._acks[:0] = acks
                failures += 1
                await asyncio.sleep(min(ACK_RETRY_MAX, ACK_RETRY_SECONDS * 2 ** failures))

    async def _publish_loop(self) -> None:
        loop = asyncio.get_running_loop()
        apart = dbthread.acks_apart()
        # Batches on their way at once: see Storage.publish_window; either way they commit
        # in the order sent. Beyond the first few, a batch goes only once it is large: a few
        # publishes wait, and grow into one batch (each batch costs the storage process a
        # transaction), unless the storage process would idle meanwhile.
        window = self.storage.publish_window
        in_flight = 0

        def done(_: asyncio.Future) -> None:
            nonlocal in_flight
            in_flight -= 1
            self._publish_work.set()

        while True:
            await self._publish_work.wait()
            self._publish_work.clear()
            while self._publishes and _may_send(in_flight, len(self._publishes), window):
                wait = self._linger.hold(len(self._publishes), self._publish_times[0],
                                         loop.time())
                if wait:
                    if self._linger_timer is None:
                        self._linger_timer = loop.call_later(wait, self._lingered)
                    break
                if self._linger_timer is not None:  # it was for publishes going now
                    self._linger_timer.cancel()
                    self._linger_timer = None
                # An ACK holds a subscriber's next NOTIFY back. Where ACKs share the database
                # thread, publishes go in slices while subscribers ACK, so an ACK queued
                # behind one waits for one slice at most.
                acking = not apart and loop.time() - self._last_ack < ACKING_SECONDS
                size = _batch_size(self._publishes, PUBLISH_SLICE if acking else MAX_BATCH)
                publishes = self._publishes[:size]
                del self._publishes[:size]
                for _ in range(size):
                    self._publish_times.popleft()
                in_flight += 1
                commit = asyncio.ensure_future(self._commit_publishes(publishes))
                self._committing.add(commit)
                commit.add_done_callback(self._committing.discard)
                commit.add_done_callback(done)

    def _lingered(self) -> None:
        self._linger_timer = None
        self._publish_work.set()

    async def _gather_acks(self, delay: float) -> None:
        """Let journaled ACKs gather for ``delay`` seconds (see ACK_GATHER_SECONDS), unless
        something waits for them to reach the database."""
        if delay <= 0 or self._apply_waiters or len(self._acks) >= MAX_BATCH:
            return
        self._ack_hurry.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ack_hurry.wait(), delay)

    async def _commit_publishes(self, batch: list[tuple[PublishRequest, asyncio.Future]]) -> None:
        began = time.perf_counter()
        try:
            results = await self.storage.publish_batch([r for r, _ in batch])
        except Exception as exc:  # nothing of this batch was committed
            self.metrics.failed("publish")
            logger.exception("publish batch of %d failed", len(batch))
            if isinstance(exc, ServiceError):
                error = exc
            elif isinstance(exc, StorageLost):  # it may have committed just before
                error = ServiceError(500, "Server error (storage process lost; the message "
                                          "may have been stored)")
            else:
                error = ServiceError(500, "Server error (nothing was committed)")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        published: list[Published] = []
        for (request, future), result in zip(batch, results, strict=True):
            if isinstance(result, Published):
                published.append(result)
                self.metrics.session(request.guid, "in")
                if result.payload is not None:
                    self._remember(result.smuid, result.payload)
            if not future.done():
                if isinstance(result, ServiceError):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        self.metrics.commit("publish", len(batch), time.perf_counter() - began)
        self.metrics.count("publish", len(published))
        self.wake(published)

    async def _commit_acks(self, batch: list[tuple[AckRequest, asyncio.Future | None]]) -> bool:
        """Commit a batch of ACKs; False when it failed (nothing of it committed, or, the
        storage process lost, maybe all of it)."""
        began = time.perf_counter()
        try:
            receipts = await self.storage.ack_batch([r for r, _ in batch])
        except Exception as exc:
            self.metrics.failed("ack")
            logger.exception("ack batch of %d failed", len(batch))
            text = ("Server error (storage process lost; the ACK may have been recorded)"
                    if isinstance(exc, StorageLost) else "Server error (ACK not recorded)")
            for request, future in batch:
                if future is not None and not future.done():
                    future.set_exception(ServiceError(500, text))
                    # Not recorded (its session answers 500): backlog reads offer it again.
                    key = (request.account_id, request.smuid)
                    if self.acked.get(key) == math.inf:
                        del self.acked[key]
            return False
        for _, future in batch:
            if future is not None and not future.done():
                future.set_result(None)
        self.metrics.commit("ack", len(batch), time.perf_counter() - began)
        self.metrics.count("ack", len(batch))
        if self.journal is not None:
            self.journal.applied(len(batch))
            self._release_caught_up(self.journal.done)
        self._batches_applied += 1
        keys = [(r.account_id, r.smuid) for r, _ in batch]
        for key in keys:
            self.acked[key] = self._batches_applied
        self._applied_keys.append((self._batches_applied, keys))
        self._forget_applied()
        self.wake(receipts)
        return True

    async def caught_up(self, timeout: float = CATCH_UP_SECONDS) -> None:
        """Returns once every ACK journaled until now is in the database (at most
        ``timeout`` seconds). A session reads its backlog after this: the store
        returns the first page of waiting messages, and ACKs still missing there would fill
        that page with messages :meth:`backlog` leaves out (a session that just sent a
        page would read it again, and get no further)."""
        if self.journal is None or not self.journal.pending:
            return
        future = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((self.journal.written, future))
        self._ack_hurry.set()
        # The database may be down (the batches are retried): read anyway after a while;
        # backlog() still leaves out what is journaled.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    def _release_caught_up(self, done: int) -> None:
        waiting = []
        for target, future in self._apply_waiters:
            if target > done:
                waiting.append((target, future))
            elif not future.done():
                future.set_result(None)
        self._apply_waiters = waiting

    def _forget_applied(self) -> None:
        """Drop the ACKs that every backlog query still running was started after."""
        floor = min(self._reads) if self._reads else self._batches_applied
        while self._applied_keys and self._applied_keys[0][0] <= floor:
            number, keys = self._applied_keys.popleft()
            for key in keys:
                if self.acked.get(key) == number:
                    del self.acked[key]

    async def backlog(self, account_ids: list[int]) -> tuple[list[tuple[int, int, int]], bool]:
        """(account, priority, smuid) of what the store holds for these accounts (each
        account's first page, :func:`~broker.services.read.backlog_for`), and whether a
        page was full. Left out: messages ACKed here whose ACK may not have reached the
        database when the query read it (in the journal, or its batch committed after the
        query began); they are ACKed, never to be offered again."""
        mark = self._batches_applied
        self._reads[mark] += 1
        try:
            rows = await dbthread.run(read.backlog_for, account_ids)
        finally:
            self._reads[mark] -= 1
            if not self._reads[mark]:
                del self._reads[mark]
        full = len(rows) >= settings.SMQP_BACKLOG_PAGE
        if self.acked:
            acked = self.acked
            rows = [row for row in rows if acked.get((row[0], row[2]), 0) <= mark]
            self._forget_applied()
        return rows, full

    # ------------------------------------------------------------------ wake-ups

    def wake(self, published: list[Published]) -> None:
        """Offer committed messages here, and tell the other processes: one message per topic
        per batch. While a batch of wake-ups is on its way to Redis the next ones gather, so
        a stream of small commits costs one channel-layer round trip at a time, not one each
        (another process hears of a message at most one round trip later)."""
        if not published:
            return
        self.offer((p.priority, p.smuid, p.accounts) for p in published)
        if not self._has_peers():
            return
        for p in published:
            if p.accounts:
                self._outgoing[p.topic_id].append([p.priority, p.smuid, p.accounts])
        if self._outgoing and (self._sender is None or self._sender.done()):
            self._sender = asyncio.ensure_future(self._send_wakeups())
            self._sender.add_done_callback(_log_failure)

    async def _send_wakeups(self) -> None:
        layer = get_channel_layer()
        while self._outgoing:
            batch, self._outgoing = self._outgoing, defaultdict(list)
            if layer is None:
                continue
            await asyncio.gather(*(
                layer.group_send(DISPATCH_GROUP, {"type": "dispatch.wake", "origin": self.origin,
                                                  "items": items})
                for items in batch.values()))
            await asyncio.sleep(WAKE_GATHER_SECONDS)

    def _has_peers(self) -> bool:
        """May another process read wake-ups (see PEER_HELLO_SECONDS)?"""
        now = asyncio.get_running_loop().time()
        if now < self._startup_until:
            return True
        for origin, heard in list(self._peers.items()):
            if now - heard <= PEER_FORGET_SECONDS:
                return True
            del self._peers[origin]
        return False

    async def _hello(self) -> None:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(DISPATCH_GROUP, {"type": "dispatch.hello",
                                                    "origin": self.origin})

    async def _greet_loop(self) -> None:
        """Say hello on the dispatch group every PEER_HELLO_SECONDS (Redis down: later)."""
        while True:
            try:
                await self._hello()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("saying hello on the dispatch group failed; trying again later")
            await asyncio.sleep(PEER_HELLO_SECONDS)

    def _heard_from(self, origin: str, kind: str) -> None:
        """A message from another process (a hello, a wake-up): it reads the group too."""
        now = asyncio.get_running_loop().time()
        heard = self._peers.get(origin)
        self._peers[origin] = now
        if kind == "dispatch.hello" and (heard is None or now - heard > PEER_FORGET_SECONDS):
            # A process that just joined learns of this one now, not a hello period later.
            answer = asyncio.ensure_future(self._hello())
            answer.add_done_callback(_log_failure)

    async def joined(self) -> None:
        """Returns once this process reads the dispatch group (or after JOIN_WAIT_SECONDS):
        a session reads its backlog after that, so what is committed later reaches it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._joined), JOIN_WAIT_SECONDS)

    async def _listen_loop(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            self._joined.set_result(None)
            return
        loop = asyncio.get_running_loop()
        # The default prefix: channels-redis then serves this channel and every consumer's
        # from one shared receive loop (a second prefix would make them take turns).
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(DISPATCH_GROUP, channel)
                break
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis down at start: keep trying, never give up listening
                logger.exception("joining the dispatch group failed; retrying")
                await asyncio.sleep(1)
        joined = loop.time()
        self._joined.set_result(None)
        self._greeter = asyncio.ensure_future(self._greet_loop())
        while True:
            try:
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                await asyncio.sleep(1)
                continue
            origin = event.get("origin")
            if origin and origin != self.origin:
                self._heard_from(origin, event.get("type", ""))
            if event.get("type") == "dispatch.wake" and origin != self.origin:
                self.offer((p, s, a) for p, s, a in event["items"])
            elif event.get("type") == "dispatch.withdraw":
                self.withdraw(event["items"])
            if loop.time() - joined > 600:  # groups expire in Redis; stay a member
                try:
                    await layer.group_add(DISPATCH_GROUP, channel)
                    joined = loop.time()
                except Exception:
                    logger.exception("renewing the dispatch group failed; retrying later")

    async def _sweep_loop(self) -> None:
        """Every ``SMQP_BACKLOG_SWEEP_SECONDS``, sessions with nothing to send are offered
        what the store holds for their account (one query for all of them). Wake-ups are
        hints that can be lost on their way between processes; this bounds the delay."""
        period = settings.SMQP_BACKLOG_SWEEP_SECONDS
        if period <= 0:
            return
        delay = min(period, PEER_STARTUP_SECONDS)  # the first one early: see PEER_HELLO_SECONDS
        while True:
            await asyncio.sleep(delay)
            delay = period
            idle: dict[int, list[Session]] = {}
            for account_id, sessions in self.sessions.items():
                quiet = [s for s in sessions if s.idle]
                if quiet:
                    idle[account_id] = quiet
            if not idle:
                continue
            try:
                rows, _ = await self.backlog(list(idle))
            except Exception:
                logger.exception("backlog sweep failed; trying again next period")
                continue
            for account_id, priority, smuid in rows:
                live = self.sessions.get(account_id, ())
                for session in idle.get(account_id, ()):
                    # (A session may have left during the query.)
                    if session in live and session.mailbox.offer(priority, smuid):
                        session.kick()

    async def _subscription_loop(self) -> None:
        """Every ``SMQP_SUBSCRIPTION_SWEEP_SECONDS``: leases that ran out end, and so do
        subscriptions whose right was revoked (profile §9.3), with their NOTIFY
        SUBSCRIPTION. The Celery beat runs the same sweep; whichever ends a subscription
        first tells its account (the other finds it gone). A listener does it too so that a
        lease ends on time without a Celery worker."""
        period = settings.SMQP_SUBSCRIPTION_SWEEP_SECONDS
        if period <= 0:
            return
        while True:
            await asyncio.sleep(period)
            try:
                await dbthread.run(subscription_service.end_subscriptions)
            except Exception:
                logger.exception("subscription sweep failed; trying again next period")

    # ------------------------------------------------------------------ message payloads

    def _remember(self, smuid: int, payload: tuple[str, str, Message]) -> None:
        entry = _pack(payload)
        self._cache[smuid] = entry
        self._cache_bytes += _entry_size(entry)
        while self._cache_bytes > CACHE_BYTES and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= _entry_size(old)

    async def load(self, smuid: int) -> tuple[str, str, Message] | None:
        """(topic path, Cmuid header, codec message) of a message, from memory or the store."""
        entry = self._cache.get(smuid)
        if entry is not None:
            return _unpack(entry)
        loaded = await dbthread.run(read.load_for_delivery, [smuid])
        return loaded.get(smuid)

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        """(retry timeout seconds, max retries, queue mode) of a topic, cached for a few
        seconds."""
        loop = asyncio.get_running_loop()
        cached = self._policies.get(topic_path)
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        policy = await dbthread.run(read.retry_policy, topic_path)
        self._policies[topic_path] = (loop.time() + 5.0, policy)
        return policy

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        """May the message still go to the account (its subscribe right may have been
        revoked)? A yes is remembered per (account, topic) for :data:`GRANT_MEMO_SECONDS`, so
        a stream of notifications costs no lookup each; a no withdraws the delivery."""
        loop = asyncio.get_running_loop()
        key = (account_id, topic_path)
        if self._grants.get(key, 0.0) > loop.time():
            return True
        ok = await dbthread.run(read.deliverable, account_id, smuid)
        if ok:
            if len(self._grants) > 10_000:
                self._grants.clear()
            self._grants[key] = loop.time() + GRANT_MEMO_SECONDS
        else:
            self._grants.pop(key, None)
        return ok

    async def dead(self, account_id: int, smuid: int) -> None:
        """The account's maximum retries are spent for this message."""
        await dbthread.run(mark_dead, [(account_id, smuid)])

    # ------------------------------------------------------------------ queue-mode locks

    async def lock(self, account_id: int, session_guid: str, smuid: int,
                   policy: DeliveryPolicy) -> bool:
        """Queue mode: lock the message to the session before its NOTIFY; False when the
        session may not send it (another account's turn now, locked by another session,
        retries spent, gone)."""
        return await dbthread.run(locks.lock, account_id, session_guid, smuid,
                                  policy.retry_timeout, policy.max_retries)

    async def ack_locked(self, request: AckRequest, session_guid: str,
                         session: Session | None = None) -> None:
        """Queue mode: the ACK of the lock's holder, decided in the database at once (no
        journal: it must be weighed against the lock); ServiceError 409 when the session no
        longer holds the lock, and nothing changed. The account's other sessions here then
        no longer send it."""
        receipts = await dbthread.run(locks.ack_locked, request.account_id, session_guid,
                                      request.smuid, request.receipt, request.door)
        self.metrics.count("ack")
        self._acked_here(request)
        self._forget_elsewhere(request, session, live_too=True)
        self.wake(receipts)

    async def release(self, account_id: int, session_guid: str,
                      smuids: list[int] | None = None, unsent: Iterable[int] = ()) -> None:
        """Queue mode: the session's locks (all, or those on ``smuids``) end now; their
        messages are offered to the next subscriber, here and in every process. Those of
        ``unsent`` were never written to the session: their attempts are given back."""
        self.wake(await dbthread.run(locks.release, account_id, session_guid, smuids,
                                     list(unsent)))

    # ------------------------------------------------------------------ operators' counters

    def health(self) -> dict:
        """This listener as the operators' console shows it (opsmetrics.listeners())."""
        return {"origin": self.origin, "host": socket.gethostname(), "pid": os.getpid(),
                # Which server this dispatcher serves (runsmqp, runqqp, daphne, ...).
                "command": _command(), "role": process_role(),
                "started": self._started_at, "at": time.time(),
                "sessions": sum(len(s) for s in self.sessions.values()),
                "storage_processes": self.storage.health(),
                "journal_backlog": len(self._acks), "publish_queue": len(self._publishes)}

    async def _metrics_loop(self) -> None:
        """Every METRICS_FLUSH_SECONDS: the counts since the last time, and this listener's
        health, to Redis (in a thread: a slow Redis never holds up the event loop)."""
        while True:
            await asyncio.sleep(METRICS_FLUSH_SECONDS)
            await self.flush_metrics()

    def unacked(self) -> dict[str, int]:
        """guid → messages sent to the session and not ACKed yet (its mailbox's one in
        flight, and the queue-mode locks it holds), for the operators' sessions list."""
        out = {}
        for sessions in self.sessions.values():
            for session in sessions:
                # (A session of a door without a login row, or a test's stand-in, has none.)
                login = getattr(session, "session", None)
                if login is not None and getattr(login, "guid", None):
                    out[login.guid] = session.mailbox.unacked
        return out

    async def flush_metrics(self) -> None:
        deltas = self.metrics.take()
        try:
            await asyncio.to_thread(opsmetrics.flush, deltas, self.health(), self.origin,
                                    self.unacked())
        except Exception:  # Redis away: the counts wait for the next flush
            self.metrics.give_back(deltas)
            logger.warning("operators' counters not written", exc_info=True)

    def close(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        for task in (self._writer, self._acker, self._listener, self._sender, self._sweeper,
                     self._subscription_sweeper, self._greeter, self._syncer,
                     self._metrics_task, *self._committing):
            if task is not None:
                task.cancel()
        self.storage.close()
        if self.journal is not None:
            self.journal.close()


def _batch_size(queued: list[tuple[PublishRequest, asyncio.Future]], most: int) -> int:
    """How many of the queued publishes go into the next batch: at most ``most``, and no
    more than :data:`MAX_BATCH_BYTES` of data unless the first alone is larger."""
    total = 0
    for count, (request, _) in enumerate(queued[:most]):
        total += sum(len(s.body) for s in request.message.sections)
        if total > MAX_BATCH_BYTES and count:
            return count
    return min(len(queued), most)


# A cached message is kept as one bytes object (marshal of plain tuples, strings and bytes),
# which the garbage collector never tracks: as codec objects, a full cache of small messages
# would be half a million tracked objects, and every full collection would walk them all
# while the listener stands still; as nested tuples, many would stay tracked until a full
# collection found them.
def _pack(payload: tuple[str, str, Message]) -> bytes:
    path, cmuid, message = payload
    return marshal.dumps((path, cmuid, tuple(message.headers),
                          tuple((tuple(s.headers), s.body) for s in message.sections)))


def _unpack(entry: bytes) -> tuple[str, str, Message]:
    path, cmuid, headers, sections = marshal.loads(entry)
    return path, cmuid, Message(list(headers),
                                [DataSection(list(h), body) for h, body in sections])


def _entry_size(entry: bytes) -> int:
    """Bytes a cache entry counts for: its own, and 512 for the rest."""
    return len(entry) + 512


#: What the console calls each broker process, by the command that started it.
ROLES = {"runsmqp": "SMQP listener", "runqqp": "QQP listener",
         "runlinks": "federation links", "daphne": "web: admin, REST, XMPP (Daphne)",
         "celery": "Celery worker"}


def _command() -> str:
    """The management command (``manage.py runsmqp``) or the module run (``python -m
    daphne``, whose argv[0] is its ``__main__.py``) of this process."""
    argv = sys.argv
    if argv and os.path.basename(argv[0]) == "__main__.py":
        return os.path.basename(os.path.dirname(argv[0]))
    if argv and os.path.basename(argv[0]) in ("manage.py", "django-admin") and len(argv) > 1:
        return argv[1]
    return os.path.basename(argv[0]) if argv else ""


def process_role() -> str:
    command = _command()
    return ROLES.get(command, command or "unknown process")


def _may_send(in_flight: int, queued: int, window: tuple[int, int, int]) -> bool:
    """May a publish batch of the ``queued`` publishes go, with ``in_flight`` on their way?
    ``window``: (at most, whatever their size, beyond that only with this many publishes:
    a batch worth its transaction); see :attr:`broker.store.lanes.Storage.publish_window`."""
    limit, always, large = window
    return in_flight < min(limit, always) or (in_flight < limit and queued >= large)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("wake-up through the channel layer failed", exc_info=task.exception())


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

