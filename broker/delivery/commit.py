"""The group commit: publishes and ACKs from all the sessions of a process queue here; one
writer task for each stores whatever has queued up in a single transaction (so a burst of
publishes costs one commit, not one each), and only then lets the sessions answer ``200`` /
``310 ACK``. The commits run in storage processes (:mod:`broker.store.lanes`), on PostgreSQL
side by side, each on a connection of its own (:func:`broker.store.dbthread.acks_apart`).

ACKs are recorded in the listener's ACK journal (:mod:`broker.store.journal`) before ``310 ACK``
goes out, and reach the database in the ACK batches behind it (``SMQP_ACK_JOURNAL=0``: the
``310 ACK`` waits for the batch's commit instead). Which ACK batch brought which ACK to the
database is kept as long as a backlog read may have missed it (:meth:`GroupCommit.backlog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable

from django.conf import settings

from broker.domain.message import Message
from broker.services import ServiceError, read, storage_calls
from broker.services.ack import AckRequest
from broker.services.publish import Published, PublishRequest
from broker.store import dbthread, journal, opsmetrics
from broker.store.lanes import Storage, StorageLost

from .linger import PublishLinger

logger = logging.getLogger("broker.delivery")

# Largest group committed at once (bounded so one commit stays short).
MAX_BATCH = 2000
# Largest group of publishes committed at once while subscribers are ACKing (an ACK that
# arrives meanwhile waits for one such slice at most); with no ACK for a second, MAX_BATCH.
PUBLISH_SLICE = 64
ACKING_SECONDS = 1.0
# Bytes of message data committed at once at most (one message may be larger): a batch is
# held in memory once more on its way to the storage process.
MAX_BATCH_BYTES = 64 * 1024 * 1024
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


class GroupCommit:
    """The publish and ACK queues of one dispatcher, their writer tasks, the storage
    processes they commit in, and the ACK journal. ``wake`` hears of what each batch
    committed (published messages, receipts); ``remember`` gets each published payload (for
    NOTIFY); ``recorded`` each ACK as soon as it is recorded."""

    def __init__(self, metrics: opsmetrics.Recorder,
                 wake: Callable[[list[Published]], None],
                 remember: Callable[[int, tuple[str, str, Message]], None],
                 recorded: Callable[[AckRequest], None]) -> None:
        self.metrics = metrics
        self._wake = wake
        self._remember = remember
        self._recorded = recorded
        self._publishes: list[tuple[PublishRequest, asyncio.Future]] = []
        self._publish_times: deque[float] = deque()  # when each of them was queued
        self.linger = PublishLinger(settings.SMQP_PUBLISH_LINGER_MS / 1000)
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
        self._sync_waiters: list[asyncio.Future] = []
        self._syncer: asyncio.Task | None = None
        # caught_up() callers: (journal records that must be applied, future).
        self._apply_waiters: list[tuple[int, asyncio.Future]] = []
        self._publish_work = asyncio.Event()
        self._ack_work = asyncio.Event()
        self._ack_hurry = asyncio.Event()  # set: end the ACK gathering pause now
        self._committing: set[asyncio.Future] = set()
        self._last_ack = float("-inf")
        self.storage = Storage(storage_calls.LISTENER_SIDE)
        self.storage.start()
        self._writer = asyncio.ensure_future(self._publish_loop())
        self._acker = asyncio.ensure_future(self._ack_loop())

    @property
    def queued(self) -> tuple[int, int]:
        """(publishes, ACKs) waiting for their batch."""
        return len(self._publishes), len(self._acks)

    def publish(self, request: PublishRequest) -> asyncio.Future[Published]:
        """Queue for the next group commit; the future is done once the message is committed
        (a plain future: a session with many publishes in flight keeps no task for each).
        A QQP item whose ResourceID was stored before (even in the same batch) gets a
        :class:`~broker.services.qqp_resources.Redundant` once its batch committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Published] = loop.create_future()
        now = loop.time()
        self.linger.arrived(now)
        self._publishes.append((request, future))
        self._publish_times.append(now)
        self._publish_work.set()
        return future

    async def ack(self, request: AckRequest, written: bool = False) -> None:
        """Record an ACK; returns once it is recorded, so that ``310 ACK`` may go: appended
        to the journal (and flushed, with ``SMQP_ACK_DURABILITY=full``), the database
        following in the next ACK batch; without a journal, once that batch committed.
        ``recorded`` hears of it (the dispatcher's memory of ACKs made here) as soon as it
        is, before a flush.

        ``written``: the door wrote the message, and that is its delivery (profile §3); no
        client waits for an answer. Without a journal such an ACK is not given up when its
        batch fails (a database failover): it goes again until it commits, as journaled
        ones do, and the session is not told of a failure it could do nothing about."""
        if self.journal is None and not written:
            future = asyncio.get_running_loop().create_future()
            # A backlog read running now may not see this ACK's commit: see backlog().
            self.acked[(request.account_id, request.smuid)] = math.inf
            self._acks.append((request, future))
            self._ack_work.set()
            await future
            self._recorded(request)
            return
        if self.journal is not None:
            try:
                self.journal.append([(request.account_id, request.smuid, request.attempts,
                                      request.receipt, request.door)])
            except OSError as exc:
                logger.exception("writing the ACK journal failed")
                raise ServiceError(500, "Server error (ACK not recorded)") from exc
        # Recorded now; no future: the batch that fails goes again (see _ack_loop).
        self.acked[(request.account_id, request.smuid)] = math.inf
        self._recorded(request)
        self._acks.append((request, None))
        self._ack_work.set()
        if len(self._acks) >= MAX_BATCH:
            self._ack_hurry.set()
        await self.durable()

    async def durable(self) -> None:
        """Returns once the ACKs recorded until now are as durable as
        ``SMQP_ACK_DURABILITY`` asks (``full``: the journal flushed)."""
        if self.journal is not None and settings.SMQP_ACK_DURABILITY == "full":
            await self._synced()

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
                if await self._commit_acks(acks):
                    failures = 0
                    if self.journal is not None:
                        await self._gather_acks(started + ACK_GATHER_SECONDS - loop.time())
                    continue
                # ACKs no client waits for (journaled, or written-is-delivered) are not
                # given up: they go again, first and in order. The others were answered.
                again = [entry for entry in acks if entry[1] is None]
                if not again:
                    continue
                self._acks[:0] = again
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
                wait = self.linger.hold(len(self._publishes), self._publish_times[0],
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
        self._wake(published)

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
        self._wake(receipts)
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

    def close(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        for task in (self._writer, self._acker, self._syncer, *self._committing):
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


def _may_send(in_flight: int, queued: int, window: tuple[int, int, int]) -> bool:
    """May a publish batch of the ``queued`` publishes go, with ``in_flight`` on their way?
    ``window``: (at most, whatever their size, beyond that only with this many publishes:
    a batch worth its transaction); see :attr:`broker.store.lanes.Storage.publish_window`."""
    limit, always, large = window
    return in_flight < min(limit, always) or (in_flight < limit and queued >= large)
