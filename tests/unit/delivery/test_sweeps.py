"""The dispatcher's sweeps (:class:`broker.delivery.sweeps.Sweeps`), alone: stand-in
sessions and backlog reads, no socket, no database."""

from __future__ import annotations

import asyncio

from broker.delivery import sweeps
from broker.delivery.sweeps import Sweeps
from tests.support.timing import scaled


class Quiet:
    """A session that records what it is offered; ``idle`` as the test sets it."""

    def __init__(self, account_id: int, idle: bool = True) -> None:
        self.account_id, self.idle = account_id, idle
        self.mailbox = self  # offers go to the session's mailbox
        self.offered: list[tuple[int, int]] = []
        self.kicked = 0

    def offer(self, priority: int, smuid: int, *, live: bool = False) -> bool:
        self.offered.append((priority, smuid))
        return True

    def kick(self) -> None:
        self.kicked += 1


async def test_the_backlog_sweep_offers_the_store_s_rows_to_idle_sessions_only(settings):
    settings.SMQP_BACKLOG_SWEEP_SECONDS = 3600
    settings.SMQP_SUBSCRIPTION_SWEEP_SECONDS = 0
    idle, busy, gone = Quiet(42), Quiet(42, idle=False), Quiet(43)
    sessions = {42: {idle, busy}, 43: {gone}}
    asked: list[list[int]] = []
    answered = asyncio.Event()

    async def backlog(account_ids: list[int]):
        asked.append(sorted(account_ids))
        del sessions[43]  # its only session left during the query
        answered.set()
        return [(42, 3, 9), (42, 1, 10), (43, 2, 11)], False

    sweep = Sweeps(sessions, backlog, first_sweep=0)
    try:
        await asyncio.wait_for(answered.wait(), scaled(5))
        await asyncio.sleep(0)
        assert asked == [[42, 43]]  # one query for every account with an idle session
        assert idle.offered == [(3, 9), (1, 10)] and idle.kicked == 2
        assert busy.offered == [] and gone.offered == []
    finally:
        sweep.close()


async def test_a_failed_backlog_sweep_is_tried_again_next_period(settings):
    settings.SMQP_BACKLOG_SWEEP_SECONDS = 0.01
    settings.SMQP_SUBSCRIPTION_SWEEP_SECONDS = 0
    session = Quiet(42)
    calls = 0
    offered = asyncio.Event()

    async def backlog(account_ids: list[int]):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database away")
        offered.set()
        return [(42, 3, 9)], False

    sweep = Sweeps({42: {session}}, backlog, first_sweep=0)
    try:
        await asyncio.wait_for(offered.wait(), scaled(5))
        await asyncio.sleep(0)
        assert calls >= 2 and (3, 9) in session.offered
    finally:
        sweep.close()


async def test_the_subscription_sweep_ends_subscriptions_and_survives_a_failure(settings,
                                                                               monkeypatch):
    settings.SMQP_BACKLOG_SWEEP_SECONDS = 0
    settings.SMQP_SUBSCRIPTION_SWEEP_SECONDS = 0.01
    ran: list[str] = []
    twice = asyncio.Event()

    async def run(fn, *args):
        ran.append(fn.__name__)
        if len(ran) == 1:
            raise ConnectionError("database away")
        twice.set()

    monkeypatch.setattr(sweeps.dbthread, "run", run)
    sweep = Sweeps({}, None, first_sweep=0)  # no backlog sweep: it is switched off
    try:
        await asyncio.wait_for(twice.wait(), scaled(5))
        assert ran[:2] == ["end_subscriptions", "end_subscriptions"]
    finally:
        sweep.close()
