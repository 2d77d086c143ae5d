"""Queue claims and the lock group commit (broker/delivery/claims.py), with no socket and no
database: a fake clock and a fake store."""

from __future__ import annotations

import asyncio

import pytest

from broker.delivery.claims import Claims, LockCommit
from broker.services.locks import LockAck, LockTake
from tests.support.timing import scaled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_claim_keeps_other_sessions_off_the_item_until_it_ends():
    clock = Clock()
    claims = Claims(clock)
    key = (7, 42)
    assert claims.claim(key, "a", 30)
    assert not claims.claim(key, "b", 30)
    assert claims.claim(key, "a", 30)  # its holder again (a resend)
    assert claims.holder(key) == "a"
    claims.drop(key, "b")  # not b's to end
    assert claims.holder(key) == "a"
    claims.drop(key, "a")
    assert claims.holder(key) is None
    assert claims.claim(key, "b", 30)
    assert len(claims) == 1


def test_a_claim_never_outlives_its_lock_deadline():
    clock = Clock()
    claims = Claims(clock)
    assert claims.claim((7, 1), "a", 30)
    clock.now += 29.9
    assert not claims.claim((7, 1), "b", 30)
    clock.now += 0.2
    assert claims.holder((7, 1)) is None
    assert claims.claim((7, 1), "b", 30)  # a's claim ended with its lock
    assert claims.holder((7, 1)) == "b"
    claims.drop_holder("a")  # a's bookkeeping of it is gone: b's claim stays
    assert claims.holder((7, 1)) == "b"


def test_drop_holder_ends_all_or_the_named_claims_of_one_session():
    claims = Claims(Clock())
    for smuid in (1, 2, 3):
        assert claims.claim((7, smuid), "a", 30)
    assert claims.claim((7, 4), "b", 30)
    claims.drop_holder("a", [(7, 2)])
    assert [claims.holder((7, m)) for m in (1, 2, 3, 4)] == ["a", None, "a", "b"]
    claims.drop_holder("a")
    assert [claims.holder((7, m)) for m in (1, 2, 3, 4)] == [None, None, None, "b"]
    assert len(claims) == 1


class FakeStore:
    """Settles as the store would: a take wins when the item is free, an ACK consumes when
    its holder holds the lock. Counts the transactions (calls)."""

    def __init__(self) -> None:
        self.locked: dict[int, str] = {}
        self.consumed: set[int] = set()
        self.calls: list[tuple[int, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def settle(self, takes: list[LockTake], acks: list[LockAck]):
        self.calls.append((len(takes), len(acks)))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        acked = []
        for ack in acks:
            ok = self.locked.get(ack.smuid) == ack.holder
            if ok:
                del self.locked[ack.smuid]
                self.consumed.add(ack.smuid)
            acked.append(ok)
        took = []
        for take in takes:
            ok = take.smuid not in self.consumed and self.locked.get(
                take.smuid, take.holder) == take.holder
            if ok:
                self.locked[take.smuid] = take.holder
            took.append(ok)
        return took, acked, [f"receipt-{a.smuid}" for a, ok in zip(acks, acked, strict=True) if ok]


async def settled(store: FakeStore, calls: int) -> None:
    """Let the loop run until the store has been called ``calls`` times."""
    for _ in range(100):
        if len(store.calls) >= calls:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the store was called {len(store.calls)} times, not {calls}")


def take(holder: str, smuid: int) -> LockTake:
    return LockTake(7, holder, smuid, 30, 5)


def ack(holder: str, smuid: int) -> LockAck:
    return LockAck(7, holder, smuid)


async def test_what_arrives_while_a_batch_commits_goes_in_one_next_batch():
    store = FakeStore()
    announced: list = []
    commit = LockCommit(store.settle, announced.extend)
    store.gate.clear()
    first = asyncio.ensure_future(commit.take(take("a", 1)))
    await settled(store, 1)
    assert store.calls == [(1, 0)]  # the first batch is committing
    later = [asyncio.ensure_future(commit.take(take(h, m)))
             for h, m in (("b", 2), ("c", 3), ("d", 1))]
    acked = asyncio.ensure_future(commit.ack(ack("a", 1)))
    await asyncio.sleep(0)
    store.gate.set()
    assert await first is True
    assert await asyncio.gather(*later) == [True, True, False]  # 1 is consumed first
    assert await acked is True
    assert store.calls == [(1, 0), (3, 1)]  # two transactions for five requests
    assert announced == ["receipt-1"]


async def test_an_ack_of_a_lock_not_held_is_false_and_changes_nothing():
    store = FakeStore()
    commit = LockCommit(store.settle, lambda receipts: None)
    assert await commit.take(take("a", 5))
    assert await commit.ack(ack("b", 5)) is False
    assert store.locked == {5: "a"} and not store.consumed


async def test_a_store_failure_reaches_every_waiting_session_and_the_next_batch_runs():
    store = FakeStore()
    commit = LockCommit(store.settle, lambda receipts: None)
    store.fail = RuntimeError("database gone")
    results = await asyncio.gather(commit.take(take("a", 1)), commit.ack(ack("b", 2)),
                                   return_exceptions=True)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    store.fail = None
    assert await commit.take(take("a", 1)) is True


async def test_a_session_that_stops_waiting_does_not_break_the_batch():
    store = FakeStore()
    commit = LockCommit(store.settle, lambda receipts: None)
    store.gate.clear()
    gone = asyncio.ensure_future(commit.take(take("a", 1)))
    staying = asyncio.ensure_future(commit.take(take("b", 2)))
    await settled(store, 1)
    gone.cancel()
    store.gate.set()
    assert await staying is True
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_settled_returns_once_what_was_queued_before_is_settled():
    """A session's release waits for the locks it took: the store must see the lock
    before the release, or the lock outlives the session."""
    store = FakeStore()
    commit = LockCommit(store.settle, lambda receipts: None)
    assert await asyncio.wait_for(commit.settled(), scaled(1)) is None  # nothing queued
    store.gate.clear()
    first = asyncio.ensure_future(commit.take(take("a", 1)))
    await settled(store, 1)
    second = asyncio.ensure_future(commit.take(take("a", 2)))  # waits for the next batch
    await asyncio.sleep(0)
    barrier = asyncio.ensure_future(commit.settled())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not barrier.done()
    store.gate.set()
    await barrier
    assert first.done() and second.done()  # both batches settled before it returned
    assert store.locked == {1: "a", 2: "a"}
