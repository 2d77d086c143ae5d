"""A storage lane whose process ended starts it again on its own (not only at the next call),
after ``SMQP_STORAGE_RESTART_SECONDS``, doubled while processes keep ending soon after their
start, and not at all once the lane is closed. The process start itself is replaced here: the
e2e health test (tests/e2e/health/test_probes.py) kills a real one."""

from __future__ import annotations

import asyncio

from django.test import override_settings

from broker.store import lanes
from broker.store.lanes import Lane


class Recording(Lane):
    def __init__(self) -> None:
        super().__init__("publish", "db", "broker.services.storage_calls")
        self.prestarts: list[float] = []

    def prestart(self) -> None:
        self.prestarts.append(asyncio.get_running_loop().time())


async def _end(lane: Recording, lived: float) -> float:
    """The lane's process ends ``lived`` seconds after its start; the wait it chose."""
    lane._started_at = asyncio.get_running_loop().time() - lived
    lane.lost()
    return lane._restart_wait


@override_settings(SMQP_STORAGE_RESTART_SECONDS=0.05)
async def test_an_ended_process_is_started_again_after_a_growing_wait() -> None:
    lane = Recording()
    waits = [await _end(lane, lived=1.0) for _ in range(4)]
    assert waits == [0.05, 0.1, 0.2, 0.4]
    # One that had lived long: the first wait again.
    assert await _end(lane, lived=lanes.SHORT_LIFE_SECONDS + 1) == 0.05
    await asyncio.sleep(0.2)
    assert lane.prestarts, "no restart was scheduled"


@override_settings(SMQP_STORAGE_RESTART_SECONDS=60)
async def test_the_wait_stops_growing_at_its_cap() -> None:
    lane = Recording()
    await _end(lane, lived=1.0)
    assert await _end(lane, lived=1.0) == lanes.MAX_RESTART_SECONDS


@override_settings(SMQP_STORAGE_RESTART_SECONDS=0.05)
async def test_a_closed_lane_starts_nothing() -> None:
    lane = Recording()
    await _end(lane, lived=1.0)
    lane.close()  # the restart already scheduled is cancelled
    lane.lost()  # and an end after the close schedules none
    await asyncio.sleep(0.2)
    assert lane.prestarts == []
