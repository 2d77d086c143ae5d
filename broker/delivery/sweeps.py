"""What the listener does by the clock: the backlog sweep (what a lost wake-up delays, it
offers within a period) and the subscription sweep (leases that ran out, rights revoked)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
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

    def close(self) -> None:
        self._sweeper.cancel()
        self._subscription_sweeper.cancel()
