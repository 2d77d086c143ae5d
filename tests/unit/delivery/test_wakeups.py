"""Wake-ups and presence (:class:`broker.delivery.wakeups.WakeUps`), alone: stand-in offer
and withdraw, an in-memory channel layer (no socket, no database). Two dispatchers on the
group together: test_dispatch_group."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.delivery import wakeups
from broker.delivery.wakeups import WakeUps
from broker.services.notify import DISPATCH_GROUP
from broker.services.publish import Published
from tests.support.timing import scaled


@pytest.fixture
def layer(settings):
    from channels.layers import get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return get_channel_layer()


class Heard:
    """Records what WakeUps hands its dispatcher."""

    def __init__(self) -> None:
        self.offered: list[tuple[int, int, list[int]]] = []
        self.sent_at: list[float | None] = []  # each offer's: None for this process's own
        self.withdrawn: list[tuple[int, int]] = []

    def offer(self, items, sent_at: float | None) -> None:
        self.offered.extend((p, s, list(a)) for p, s, a in items)
        self.sent_at.append(sent_at)

    def withdraw(self, items) -> None:
        self.withdrawn.extend(tuple(i) for i in items)


async def eventually(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.01)
    return bool(condition())


async def test_the_group_s_wake_ups_and_withdrawals_reach_the_dispatcher_but_not_its_own(layer):
    heard = Heard()
    group = WakeUps("me", heard.offer, heard.withdraw)
    try:
        await group.joined()
        await layer.group_send(DISPATCH_GROUP, {"type": "dispatch.wake", "origin": "me",
                                                "items": [[1, 8, [42]]]})
        await layer.group_send(DISPATCH_GROUP, {"type": "dispatch.wake", "origin": "other",
                                                "items": [[3, 9, [42, 43]]], "at": 1234.5})
        await layer.group_send(DISPATCH_GROUP, {"type": "dispatch.withdraw",
                                                "items": [[42, 7]]})
        assert await eventually(lambda: heard.withdrawn)
        # Its own wake-up was offered when it committed, not again when it came back.
        assert heard.offered == [(3, 9, [42, 43])]
        assert heard.sent_at == [1234.5]  # when the other process sent it, for the dispatcher
        assert heard.withdrawn == [(42, 7)]
        assert group._has_peers()  # "other" spoke on the group
    finally:
        group.close()


async def test_a_commit_is_offered_here_and_told_to_the_group_only_with_peers(layer,
                                                                            monkeypatch):
    monkeypatch.setattr(wakeups, "PEER_STARTUP_SECONDS", 0)
    monkeypatch.setattr(wakeups, "PEER_HELLO_SECONDS", 600)
    sent: list[dict] = []
    real = layer.group_send

    async def spy(group: str, message: dict) -> None:
        sent.append(message)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    heard = Heard()
    group = WakeUps("me", heard.offer, heard.withdraw)
    try:
        await group.joined()
        assert await eventually(lambda: sent)
        assert [m["type"] for m in sent] == ["dispatch.hello"]  # it said hello on joining
        group.wake([])  # nothing committed: nothing done
        group.wake([Published(9, 7, "/t", 3, [42])])
        assert await eventually(lambda: heard.offered)
        await asyncio.sleep(scaled(0.05))  # a quiet window: nothing goes to the group
        assert heard.offered == [(3, 9, [42])]
        assert heard.sent_at == [None]  # offered here at its commit
        assert [m["type"] for m in sent] == ["dispatch.hello"]  # alone: told nobody
        # Another process says hello: it is answered at once, and hears of commits.
        await real(DISPATCH_GROUP, {"type": "dispatch.hello", "origin": "other"})
        assert await eventually(lambda: len(sent) == 2)
        assert sent[1] == {"type": "dispatch.hello", "origin": "me"}
        before = time.time()
        group.wake([Published(10, 7, "/t", 3, [42]), Published(11, 8, "/u", 1, [43]),
                    Published(12, 7, "/t", 2, [42]), Published(13, 7, "/t", 2, [])])
        assert await eventually(lambda: len(sent) == 4)
        # Each stamped with when it was sent (its receivers judge how late it comes).
        assert all(before <= m["at"] <= time.time() for m in sent[2:])
        wakes = sorted((m["items"] for m in sent[2:]), key=len)
        # One wake-up per topic; a message for nobody is not announced.
        assert wakes == [[[1, 11, [43]]], [[3, 10, [42]], [2, 12, [42]]]]
        assert all(m["origin"] == "me" for m in sent[2:])
    finally:
        group.close()
