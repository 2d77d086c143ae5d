"""Waits in tests, scaled for a busy machine.

``SMQP_TEST_SLOWDOWN`` (default 1) multiplies every budget a test waits within: the time a
server gets to start, a reply to arrive, a message to be delivered, and the pytest-timeout
limits (tests/conftest.py scales those). On a loaded machine run with e.g.
``SMQP_TEST_SLOWDOWN=3``: a test then waits longer for what it expects, and asserts the same.
A quiet window (nothing arrives within N seconds) scales too, which makes that check stricter;
a "takes effect within N seconds" bound scales as well, so at a factor above 1 it is a bound for
the loaded machine. At the default 1 every wait is the number written in the test.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _factor() -> float:
    raw = os.environ.get("SMQP_TEST_SLOWDOWN", "").strip()
    if not raw:
        return 1.0
    value = float(raw)
    if value <= 0:
        raise ValueError(f"SMQP_TEST_SLOWDOWN must be a positive number, not {raw!r}")
    return value


SLOWDOWN = _factor()


def scaled(seconds: float) -> float:
    """``seconds`` times ``SMQP_TEST_SLOWDOWN``: use for every wait budget in a test."""
    return seconds * SLOWDOWN


def wait_until(condition: Callable[[], T], timeout: float, interval: float = 0.05,
               message: str = "condition") -> T:
    """Poll ``condition`` until it returns something truthy (returned), for at most
    ``scaled(timeout)`` seconds; AssertionError naming ``message`` otherwise."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {scaled(timeout):.1f} s")
        time.sleep(interval)


async def async_wait_until(condition: Callable[[], Awaitable[T]], timeout: float,
                           interval: float = 0.05, message: str = "condition") -> T:
    """:func:`wait_until` for a coroutine condition."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {scaled(timeout):.1f} s")
        await asyncio.sleep(interval)
