"""Queue mode's claims: which session of this process tries a queue item, and the group
commit of locks and holder ACKs.

A queue item is offered to every live session of its account here (they cannot tell a
queue item from a fan-out one before loading it). Without a claim each of them would then
try to lock it in the store, one transaction each, all but one in vain: with 16 workers, 15
wasted transactions per item, and workers made the queue slower. A session first *claims*
the item here; a session of this process holding an unexpired claim on it makes the others
pass it by with no store call. The claim ends when its lock ends here (ACK, release, lost
to another process) or at the lock's deadline, whichever comes first, so a claim never
outlives the lock it stands for.

The store still decides (:mod:`broker.services.locks`): across processes and doors only its
conditional UPDATEs make an item go to one session. What reaches it is gathered while the
previous batch commits and settled in one transaction (:func:`broker.services.locks.settle`),
as publishes and fan-out ACKs are: N workers cost one commit per round, not 2N.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.services.locks import LockAck, LockTake
from broker.services.publish import Published

logger = logging.getLogger(__name__)

Key = tuple[int, int]  # (account, smuid)
Settle = Callable[[list[LockTake], list[LockAck]],
                  Awaitable[tuple[list[bool], list[bool], list[Published]]]]


class Claims:
    """Claims of this process's sessions on queue items: (account, smuid) → (session guid,
    loop time its claim ends). Pure bookkeeping, no I/O."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._held: dict[Key, tuple[str, float]] = {}
        self._by_holder: dict[str, set[Key]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def claim(self, key: Key, holder: str, seconds: float) -> bool:
        """Claim ``key`` for ``holder`` for ``seconds``; False when another holder's claim on
        it has not ended."""
        now = self._clock()
        current = self._held.get(key)
        if current is not None and current[0] != holder and current[1] > now:
            return False
        if current is not None and current[0] != holder:
            self._forget(key, current[0])
        self._held[key] = (holder, now + seconds)
        self._by_holder.setdefault(holder, set()).add(key)
        return True

    def holder(self, key: Key) -> str | None:
        current = self._held.get(key)
        if current is None or current[1] <= self._clock():
            return None
        return current[0]

    def drop(self, key: Key, holder: str) -> None:
        """``holder``'s claim on ``key`` ends (another's stays)."""
        current = self._held.get(key)
        if current is not None and current[0] == holder:
            del self._held[key]
            self._forget(key, holder)

    def drop_holder(self, holder: str, keys: list[Key] | None = None) -> None:
        """``holder``'s claims end: all of them, or those on ``keys``."""
        for key in list(self._by_holder.get(holder, ())) if keys is None else keys:
            self.drop(key, holder)

    def _forget(self, key: Key, holder: str) -> None:
        keys = self._by_holder.get(holder)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_holder[holder]


class LockCommit:
    """Lock takes and holder ACKs of this process's sessions, settled in the store in
    batches: what arrives while a batch commits goes in the next one (one at a time)."""

    def __init__(self, settle: Settle, announce: Callable[[list[Published]], None]) -> None:
        self._settle = settle
        self._announce = announce
        self._takes: list[tuple[LockTake, asyncio.Future[bool]]] = []
        self._acks: list[tuple[LockAck, asyncio.Future[bool]]] = []
        # settled() callers, resolved once the batch after their call has committed.
        self._barriers: list[asyncio.Future[None]] = []
        self._runner: asyncio.Task | None = None

    async def take(self, request: LockTake) -> bool:
        """Lock the item to its session: True when the store gave it the lock."""
        return await self._queue(self._takes, request)

    async def ack(self, request: LockAck) -> bool:
        """The holder's ACK: True when it consumed the item, False when the session no
        longer held the lock (nothing changed)."""
        return await self._queue(self._acks, request)

    async def settled(self) -> None:
        """Return once every take and ACK queued before this call is settled: a release of
        a session's locks must not reach the store before a lock it took (the lock would
        outlive the session until its deadline)."""
        if self._runner is None or self._runner.done():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barriers.append(future)
        await future

    async def _queue(self, queue: list[tuple[Any, asyncio.Future[bool]]], request: Any) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        queue.append((request, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        try:
            await self._batches()
        finally:
            for barrier in self._barriers:  # nothing left to wait for (or shutting down)
                if not barrier.done():
                    barrier.set_result(None)
            self._barriers = []

    async def _batches(self) -> None:
        while self._takes or self._acks:
            takes, self._takes = self._takes, []
            acks, self._acks = self._acks, []
            barriers, self._barriers = self._barriers, []
            try:
                took, acked, receipts = await self._settle([t for t, _ in takes],
                                                           [a for a, _ in acks])
            except asyncio.CancelledError:
                for _, future in takes + acks:
                    future.cancel()
                self._barriers += barriers
                raise
            except Exception as exc:  # the store failed: each waiting session hears it
                for _, future in takes + acks:
                    if not future.done():
                        future.set_exception(exc)
                self._release(barriers)
                continue
            for (_, future), ok in zip(takes + acks, took + acked, strict=True):
                if not future.done():
                    future.set_result(ok)
            self._release(barriers)
            if receipts:
                try:
                    self._announce(receipts)
                except Exception:
                    logger.exception("announcing receipts failed")

    @staticmethod
    def _release(barriers: list[asyncio.Future[None]]) -> None:
        for barrier in barriers:
            if not barrier.done():
                barrier.set_result(None)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
