"""The dispatcher's place on the dispatch group (two dispatchers on one in-memory channel
layer stand for two processes; the real two-process case is in test_e2e_durability)."""

from __future__ import annotations

import asyncio

import pytest

from broker import delivery
from broker.delivery import Dispatcher


class Probe:
    """A session of account 42 that records what it is offered."""

    account_id = 42
    idle = True

    def __init__(self) -> None:
        self.offered: list[tuple[int, int]] = []

    def offer(self, priority: int, smuid: int) -> None:
        self.offered.append((priority, smuid))


@pytest.fixture
def layer(settings):
    from channels.layers import get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return get_channel_layer()


async def test_a_dispatcher_that_cannot_join_at_first_keeps_trying(layer, monkeypatch):
    """Redis down when the first session logs in: the dispatcher joins once it is back (it
    used to give up for good), and a login waits for that a bounded time only."""
    real = layer.group_add
    failures = [1]

    async def flaky(group: str, channel: str) -> None:
        if failures:
            failures.pop()
            raise ConnectionError("redis is down")
        await real(group, channel)

    monkeypatch.setattr(layer, "group_add", flaky)
    monkeypatch.setattr(delivery, "JOIN_WAIT_SECONDS", 0.1)
    a = Dispatcher()
    probe = Probe()
    a.register(probe)
    try:
        await a.joined()  # gives up waiting after 0.1 s: the retry comes after 1 s
        assert not a._joined.done()
        await asyncio.wait_for(asyncio.shield(a._joined), 3)
        other = Dispatcher()  # another process commits a message for account 42
        try:
            other.wake([delivery.Published(9, 7, "/t", 3, [42])])
            await asyncio.sleep(0.1)
        finally:
            other.close()
        assert probe.offered == [(3, 9)]
    finally:
        a.close()


async def test_a_worker_s_wake_up_is_offered(layer):
    a = Dispatcher()
    probe = Probe()
    a.register(probe)
    try:
        await a.joined()
        await layer.group_send(delivery.DISPATCH_GROUP, {
            "type": "dispatch.wake", "origin": "", "items": [[3, 9, [42]]]})
        await asyncio.sleep(0.05)
        assert probe.offered == [(3, 9)]
    finally:
        a.close()
