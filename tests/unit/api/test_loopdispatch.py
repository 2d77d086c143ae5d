"""The REST pull's wait (api.loopdispatch): the view's thread registers with the event loop's
dispatcher before its first look at the store, is woken by an offer to its account only,
and is gone from the dispatcher once the pull ends. Over HTTP: e2e/rest/test_pull_wakeup."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from api.loopdispatch import LoopDispatcher
from broker.services import ServiceError
from tests.support.timing import scaled


class Watchers:
    """Dispatcher.watch / unwatch / joined, and offer's part that wakes them."""

    def __init__(self) -> None:
        self.watchers: defaultdict[int, set] = defaultdict(set)
        self.joined_calls = 0

    def watch(self, account_id, wake) -> None:
        self.watchers[account_id].add(wake)

    def unwatch(self, account_id, wake) -> None:
        self.watchers[account_id].discard(wake)
        if not self.watchers[account_id]:
            del self.watchers[account_id]

    async def joined(self) -> None:
        self.joined_calls += 1

    def offer(self, account_id: int) -> None:
        for wake in tuple(self.watchers.get(account_id, ())):
            wake()


async def test_a_pull_thread_is_woken_by_an_offer_to_its_account_only():
    loop = asyncio.get_running_loop()
    dispatcher = Watchers()
    wakeups = LoopDispatcher(loop, dispatcher)
    registered = asyncio.Event()
    offered = asyncio.Event()

    def view() -> tuple[bool, bool]:  # as the pull view, on a worker thread
        with wakeups.watching(7) as woken:
            assert dispatcher.joined_calls == 1 and 7 in dispatcher.watchers
            loop.call_soon_threadsafe(registered.set)
            other = woken.wait(scaled(0.2))  # (an offer to account 8 comes meanwhile)
            loop.call_soon_threadsafe(offered.set)
            return other, woken.wait(scaled(30))

    pull = asyncio.ensure_future(asyncio.to_thread(view))
    await asyncio.wait_for(registered.wait(), scaled(30))
    dispatcher.offer(8)
    await asyncio.wait_for(offered.wait(), scaled(30))
    dispatcher.offer(7)
    other, own = await asyncio.wait_for(pull, scaled(30))
    assert (other, own) == (False, True)
    await asyncio.sleep(0)  # the unwatch scheduled from the thread
    assert dispatcher.watchers == {}


class Committer:
    """Dispatcher.publish: a future the group commit settles (here, at once)."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.requests: list = []

    def publish(self, request) -> asyncio.Future:
        assert asyncio.get_running_loop() is not None  # called on the loop, not the thread
        self.requests.append(request)
        future = asyncio.get_running_loop().create_future()
        if isinstance(self.outcome, Exception):
            future.set_exception(self.outcome)
        else:
            future.set_result(self.outcome)
        return future


async def test_a_publish_from_a_view_thread_joins_the_loops_group_commit():
    loop = asyncio.get_running_loop()
    committer = Committer("published")
    result = await asyncio.to_thread(LoopDispatcher(loop, committer).publish, "request")
    assert result == "published" and committer.requests == ["request"]


async def test_a_refusal_by_the_group_commit_is_raised_in_the_view_thread():
    loop = asyncio.get_running_loop()
    refusal = ServiceError(404, "Not found (topic)")
    bridge = LoopDispatcher(loop, Committer(refusal))
    with pytest.raises(ServiceError) as raised:
        await asyncio.to_thread(bridge.publish, "request")
    assert raised.value is refusal
