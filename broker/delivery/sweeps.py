"""What the listener does by the clock: the backlog sweep (what a lost wake-up delays, it
offers within a period) and the subscription sweep (leases that ran out, rights revoked);
and the same backlog read at once for the accounts a late wake-up named (``read_soon``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from django.conf import settings

from broker.services import subscriptions as subscription_service
from broker.store import dbthread

if TYPE_CHECKING:
    from .dispatcher import Session

logger = logging.getLogger("broker.delivery")

#: A backlog read (:meth:`broker.delivery.dispatcher.Dispatcher.backlog`).
Backlog = Callable[[list[int]], Awaitable[tuple[list[tuple[int, int, int]], bool]]]


class Sweeps:
    """The two periodic sweeps of one dispatcher, over its live ``sessions`` (account →
    sessions, shared with the dispatcher), each a task from construction to :meth:`close`.
    The first backlog sweep comes after ``first_sweep`` seconds at most."""

    def __init__(self, sessions: dict[int, set[Session]], backlog: Backlog,
                 first_sweep: float) -> None:
        self.sessions = sessions
        self._backlog = backlog
        self._first_sweep = first_sweep
        self._sweeper = asyncio.ensure_future(self._sweep_loop())
        self._subscription_sweeper = asyncio.ensure_future(self._subscription_loop())
        self._asked: set[int] = set()  # accounts read_soon() was asked for, not read yet
        self._reader: asyncio.Task | None = None

    async def _sweep_loop(self) -> None:
        """Every ``SMQP_BACKLOG_SWEEP_SECONDS``, sessions with nothing to send are offered
        what the store holds for their account (one query for all of them). Wake-ups are
        hints that can be lost on their way between processes; this bounds the delay."""
        period = settings.SMQP_BACKLOG_SWEEP_SECONDS
        if period <= 0:
            return
        delay = min(period, self._first_sweep)  # the first early: see wakeups.PEER_HELLO_SECONDS
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
                rows, _ = await self._backlog(list(idle))
            except Exception:
                logger.exception("backlog sweep failed; trying again next period")
                continue
            self._offer_rows(rows, idle)

    def read_soon(self, account_ids: Iterable[int]) -> None:
        """Offer every session here of these accounts what the store holds for them, at
        once (one query for all the accounts asked for before it runs): the accounts a
        wake-up that came too late named (see ``Dispatcher.offer``)."""
        self._asked.update(account_ids)
        if self._asked and (self._reader is None or self._reader.done()):
            self._reader = asyncio.ensure_future(self._read_asked())

    async def _read_asked(self) -> None:
        while self._asked:
            asked, self._asked = self._asked, set()
            targets = {a: list(self.sessions[a]) for a in asked if self.sessions.get(a)}
            if not targets:
                continue
            try:
                rows, _ = await self._backlog(list(targets))
            except Exception:
                logger.exception("reading the store for late wake-ups failed; the backlog "
                                 "sweep tries again")
                continue
            self._offer_rows(rows, targets)

    def _offer_rows(self, rows: list[tuple[int, int, int]],
                    targets: dict[int, list[Session]]) -> None:
        """(account, priority, smuid) rows of a backlog read → the ``targets`` sessions of
        each account that are still live (one may have left during the query)."""
        for account_id, priority, smuid in rows:
            live = self.sessions.get(account_id, ())
            for session in targets.get(account_id, ()):
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

    def close(self) -> None:
        for task in (self._sweeper, self._subscription_sweeper, self._reader):
            if task is not None:
                task.cancel()
