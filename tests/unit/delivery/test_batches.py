"""How the group commit cuts queued publishes into batches (:func:`_batch_size`), how
many go at once (:func:`_may_send`), and in which order PostgreSQL's two publish lanes
commit them (:meth:`broker.store.lanes.Storage._publish_held`)."""

from __future__ import annotations

import asyncio

import pytest

from broker.delivery import commit, dispatcher
from broker.delivery.linger import PublishLinger
from broker.services.publish import Published, PublishRequest
from broker.smqp.message import DataSection, Message
from broker.store import lanes as storage
from tests.support.timing import scaled


def queued(*sizes: int) -> list:
    return [(PublishRequest(1, "g", "MESSAGE", "/t", f"c{i}",
                            Message([], [DataSection([], b"x" * size)])), None)
            for i, size in enumerate(sizes)]


def test_a_batch_stops_before_the_byte_limit(monkeypatch):
    monkeypatch.setattr(commit, "MAX_BATCH_BYTES", 100)
    assert commit._batch_size(queued(40, 40, 40, 40), 10) == 2
    assert commit._batch_size(queued(40, 60, 1), 10) == 2  # exactly the limit fits


def test_a_message_over_the_limit_goes_alone(monkeypatch):
    monkeypatch.setattr(commit, "MAX_BATCH_BYTES", 100)
    assert commit._batch_size(queued(500, 1, 1), 10) == 1
    assert commit._batch_size(queued(1, 500, 1), 10) == 1


def test_the_count_limit_still_holds(monkeypatch):
    monkeypatch.setattr(commit, "MAX_BATCH_BYTES", 10**9)
    assert commit._batch_size(queued(*[10] * 50), 8) == 8
    assert commit._batch_size(queued(10, 10), 8) == 2
    assert commit._batch_size([], 8) == 0


def test_how_many_batches_go_at_once():
    sqlite, postgres, one = (4, 2, 32), (2, 1, 128), (1, 1, 0)
    # SQLite: up to two, whatever is queued.
    assert commit._may_send(0, 1, sqlite) and commit._may_send(1, 1, sqlite)
    # A third and fourth: only a batch of 32 or more (a few publishes wait and grow).
    assert not commit._may_send(2, 31, sqlite)
    assert commit._may_send(2, 32, sqlite) and commit._may_send(3, 500, sqlite)
    # Never beyond the limit.
    assert not commit._may_send(4, 500, sqlite)
    # PostgreSQL's two publish lanes: one whatever its size, a second only when large.
    assert commit._may_send(0, 1, postgres)
    assert not commit._may_send(1, 127, postgres)
    assert commit._may_send(1, 128, postgres)
    assert not commit._may_send(2, 500, postgres)
    # One lane whose commits wait for the disk: one at a time, however many are queued.
    assert commit._may_send(0, 1, one)
    assert not commit._may_send(1, 500, one)


class FakeLane:
    """A publish lane whose calls the test answers: begin at once, commit when released."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        self.commit_may_go: dict[str, asyncio.Event] = {}
        self.begin_held: dict[str, asyncio.Event] = {}  # a begin that waits (slow to build)
        self.fail: set[str] = set()

    async def call(self, name: str, *args):
        if name == "publish_batch":  # a small batch, begun and committed in one call
            batch = args[0][0]
            self.log.append(f"whole {batch} on {self.name}")
            await self.commit_may_go.setdefault(batch, asyncio.Event()).wait()
            self.log.append(f"committed {batch}")
            return [f"result {batch}"]
        if name == "publish_begin":
            batch = args[0][0]
            self.current = batch
            self.log.append(f"begin {batch} on {self.name}")
            await asyncio.sleep(0)
            if batch in self.begin_held:
                await self.begin_held[batch].wait()
            self.log.append(f"began {batch}")
            if f"begin {batch}" in self.fail:
                raise RuntimeError("refused")
            return [f"result {batch}"]
        batch = self.current
        gate = self.commit_may_go.setdefault(batch, asyncio.Event())
        await gate.wait()
        self.log.append(f"commit {batch}")
        if f"commit {batch}" in self.fail:
            raise RuntimeError("commit failed")
        return None


@pytest.fixture(autouse=True)
def _every_batch_held(monkeypatch, request):
    """The held-lane tests send one-publish batches standing for large ones."""
    if "small" not in request.node.name:
        monkeypatch.setattr(storage, "SECOND_LANE_MIN", 1)


def held_storage(log: list[str]) -> storage.Storage:
    held = storage.Storage.__new__(storage.Storage)
    held._publishers = [FakeLane("a", log), FakeLane("b", log)]
    held._idle_publishers = list(held._publishers)
    held._opening = asyncio.Lock()
    held._last_commit = None
    return held


async def settle() -> None:
    """Let every task run as far as it can: the fake lanes do no I/O and set no timers, so a
    number of event-loop turns (not a wall-clock sleep, which a loaded machine may cut short
    of them) brings them all to where they wait."""
    for _ in range(100):
        await asyncio.sleep(0)


async def release(held: storage.Storage, batch: str) -> None:
    for lane in held._publishers:
        lane.commit_may_go.setdefault(batch, asyncio.Event()).set()
    await settle()


async def test_held_batches_commit_in_the_order_sent_whichever_lane_is_ready_first():
    log: list[str] = []
    held = held_storage(log)
    first = asyncio.ensure_future(held._publish_held(["1"]))
    second = asyncio.ensure_future(held._publish_held(["2"]))
    await settle()
    began = ["begin 1 on a", "began 1", "begin 2 on b", "began 2"]
    assert log == began  # the second is built meanwhile
    await release(held, "2")  # its lane is ready: it still waits for the first's COMMIT
    assert log == began and not second.done()
    await release(held, "1")
    assert log == [*began, "commit 1", "commit 2"]
    assert await first == ["result 1"] and await second == ["result 2"]
    third = asyncio.ensure_future(held._publish_held(["3"]))  # a lane is idle again
    await release(held, "3")
    assert await third == ["result 3"] and log[-3:] == ["begin 3 on a", "began 3", "commit 3"]


async def test_held_batches_begin_one_at_a_time_in_the_order_sent():
    """Each batch takes its smuids as it begins: the next begins once it has, so smuids
    grow in publish order across the two lanes."""
    log: list[str] = []
    held = held_storage(log)
    held._publishers[0].begin_held["1"] = slow = asyncio.Event()
    first = asyncio.ensure_future(held._publish_held(["1"]))
    second = asyncio.ensure_future(held._publish_held(["2"]))
    await settle()
    assert log == ["begin 1 on a"]
    slow.set()
    await settle()
    assert log == ["begin 1 on a", "began 1", "begin 2 on b", "began 2"]
    await release(held, "1")
    await release(held, "2")
    assert await first == ["result 1"] and await second == ["result 2"]


@pytest.mark.parametrize("failing", ["begin 1", "commit 1"])
async def test_a_failed_batch_does_not_hold_the_next_one_back(failing):
    log: list[str] = []
    held = held_storage(log)
    for lane in held._publishers:
        lane.fail.add(failing)
    first = asyncio.ensure_future(held._publish_held(["1"]))
    second = asyncio.ensure_future(held._publish_held(["2"]))
    await release(held, "1")
    await release(held, "2")
    with pytest.raises(RuntimeError):
        await first
    assert await second == ["result 2"]
    assert sorted(lane.name for lane in held._idle_publishers) == ["a", "b"]


async def test_a_small_batch_goes_in_one_call_after_the_held_one_before_it_committed():
    """Fewer than SECOND_LANE_MIN publishes: begun and committed in one call (no round trip
    between), once the batch before it committed; the next begins after it."""
    log: list[str] = []
    held = held_storage(log)
    big = [f"big{i}" for i in range(storage.SECOND_LANE_MIN)]
    first = asyncio.ensure_future(held._publish_held(big))
    small = asyncio.ensure_future(held._publish_held(["small"]))
    after = asyncio.ensure_future(held._publish_held(["after"]))
    await settle()
    assert log == ["begin big0 on a", "began big0"]  # the small one waits for its COMMIT
    await release(held, "big0")
    await release(held, "small")
    await release(held, "after")
    assert log == ["begin big0 on a", "began big0", "commit big0", "whole small on b",
                   "committed small", "whole after on a", "committed after"]
    assert await first == ["result big0"] and await small == ["result small"]
    assert await after == ["result after"]


# ------------------------------------------------------------------ lingering (PublishLinger)


def stream(linger: PublishLinger, rate: float, start: float, end: float) -> float:
    """Publishes at ``rate`` a second from ``start`` to ``end``; returns the last one's time."""
    t = start
    while t < end:
        linger.arrived(t)
        t += 1 / rate
    return t - 1 / rate


def test_a_small_batch_waits_for_company_only_under_a_fast_stream():
    linger = PublishLinger(0.004, batch=32, rate=2000, window=0.25, gaps=2,
                                    gap_min=0.0005)
    # 1,000 publishes a second: each batch goes at once (the wait would gather a handful).
    last = stream(linger, 1000, 0.0, 1.0)
    assert linger.hold(1, last, last) == 0
    # 4,000 a second: a batch of 5 waits while publishes keep coming (up to 2 mean intervals
    # after the latest, 0.5 ms) ...
    last = stream(linger, 4000, 1.0, 2.0)
    assert linger.hold(5, last - 0.001, last) == pytest.approx(0.0005, rel=0.02)
    assert linger.hold(5, last - 0.001, last + 0.0002) == pytest.approx(0.0003, rel=0.02)
    # ... until its first publish has waited 4 ms, however many more keep coming ...
    linger.arrived(last + 0.0025)
    assert linger.hold(5, last - 0.001, last + 0.0025) == pytest.approx(0.0005, rel=0.02)
    linger.arrived(last + 0.0029)
    assert linger.hold(5, last - 0.001, last + 0.0029) == pytest.approx(0.0001, rel=0.02)
    last += 0.0029
    # ... or no more came for over 0.5 ms (publishers that wait for their replies: all in) ...
    assert linger.hold(5, last - 0.001, last + 0.0006) == 0
    # ... unless it is large enough already.
    assert linger.hold(32, last, last) == 0
    assert linger.hold(31, last, last) == pytest.approx(0.0005, rel=0.02)
    # The stream stops: what is queued goes at once, and so does the first publish after a
    # quiet spell (the quiet spell is in its rate).
    assert linger.hold(3, last, last + 0.6) == 0
    linger.arrived(last + 5.0)
    assert linger.hold(1, last + 5.0, last + 5.0) == 0
    # Lingering switched off (SMQP_PUBLISH_LINGER_MS=0).
    off = PublishLinger(0, batch=32, rate=2000, window=0.25)
    last = stream(off, 10_000, 0.0, 1.0)
    assert off.hold(1, last, last) == 0


class RecordingStorage:
    """Stands in for the storage processes: commits every batch at once, records sizes."""

    publish_window = (4, 2, 32)

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def publish_batch(self, requests: list) -> list:
        self.batches.append(len(requests))
        return [Published(i + 1, 7, "/t", 0, []) for i, _ in enumerate(requests)]

    def close(self) -> None:
        pass


def test_the_dispatcher_holds_a_small_batch_back_until_it_fills_or_its_time_is_up(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

    async def scenario() -> list[int]:
        facade = dispatcher.Dispatcher()
        real, fake = facade.storage, RecordingStorage()
        facade.commits.storage = fake  # before the publish loop's first step reads its window
        real.close()
        # Every rate counts as a stream, and a held batch waits (all but) forever.
        facade.commits.linger = PublishLinger(3600, batch=8, rate=0, window=3600,
                                                    gap_min=3600)
        try:
            first = [facade.publish(queued(10)[0][0]) for _ in range(3)]
            await asyncio.sleep(scaled(0.05))  # a quiet window: the linger is an hour
            assert fake.batches == []  # held: three are not a batch worth its transaction
            rest = [facade.publish(queued(10)[0][0]) for _ in range(5)]
            await asyncio.wait_for(asyncio.gather(*first, *rest), scaled(5))
            assert fake.batches == [8]  # the eighth made it worth sending: all together
            # A held batch goes once its first publish has waited the linger time.
            facade.commits.linger.seconds = 0.05
            await asyncio.wait_for(facade.publish(queued(10)[0][0]), scaled(5))
            return fake.batches
        finally:
            facade.close()

    assert asyncio.run(scenario()) == [8, 1]
