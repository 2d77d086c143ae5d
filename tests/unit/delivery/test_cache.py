"""The dispatcher's cache of committed messages, kept for NOTIFY
(:class:`broker.delivery.cache.PayloadCache`).

An entry is one bytes object, which the garbage collector never tracks: a full cache must
not be hundreds of thousands of objects for every full collection to walk while the
listener stands still. The rest of the behaviour (what NOTIFY sends) is tested
end to end over sockets; here, the cache itself, without a running payloads.
"""

from __future__ import annotations

import gc

from broker.delivery import cache
from broker.delivery.cache import PayloadCache
from broker.services.read import DeliveryPolicy
from broker.smqp.message import DataSection, Message


def message(tag: str, *bodies: bytes) -> Message:
    return Message([("Name", tag), ("Priority", "2"), ("X-Trace", f"t-{tag}")],
                   [DataSection([("Content-Type", "application/octet-stream"),
                                 ("X-Part", str(i))], body)
                    for i, body in enumerate(bodies)])


async def test_a_remembered_message_comes_back_whole_and_as_a_copy():
    payloads = PayloadCache()
    original = message("m1", b"\x00\x01binary", b"", b"third")
    payloads.remember(7, ("/t/a", "c/1/2", original))

    path, cmuid, loaded = await payloads.load(7)
    assert (path, cmuid) == ("/t/a", "c/1/2")
    assert loaded == original and loaded is not original
    # What a caller does to its copy never reaches the cache.
    loaded.headers.append(("X-Mine", "1"))
    loaded.sections[0].headers.clear()
    assert (await payloads.load(7))[2] == original


async def test_cache_entries_are_not_tracked_by_the_garbage_collector():
    payloads = PayloadCache()
    for smuid in range(200):
        payloads.remember(smuid, ("/t", f"c/{smuid}", message(str(smuid), b"x" * 64)))
    # Not even before a collection has looked at them: nothing for one to walk.
    assert [smuid for smuid, entry in payloads._cache.items() if gc.is_tracked(entry)] == []
    # The codec objects, by contrast, are tracked: this is what the entries avoid.
    assert gc.is_tracked(message("m", b"x"))


async def test_the_oldest_entries_go_once_the_cache_is_over_its_bytes(monkeypatch):
    entry_size = cache._entry_size(cache._pack(("/t", "c/0", message("0", b"x" * 100))))
    monkeypatch.setattr(cache, "CACHE_BYTES", 3 * entry_size)
    payloads = PayloadCache()
    for smuid in range(5):
        payloads.remember(smuid, ("/t", f"c/{smuid}", message(str(smuid), b"x" * 100)))
    assert list(payloads._cache) == [2, 3, 4]
    assert payloads._cache_bytes == 3 * entry_size


class Lookups:
    """Stands for the database thread: answers read.retry_policy / read.deliverable, and
    counts the lookups."""

    def __init__(self, allowed: bool = True) -> None:
        self.allowed = allowed
        self.calls: list[str] = []

    async def run(self, fn, *args):
        self.calls.append(fn.__name__)
        if fn.__name__ == "retry_policy":
            return DeliveryPolicy(30, 5, queue=False)
        return self.allowed


async def test_a_topic_s_policy_is_looked_up_once_for_a_while(monkeypatch):
    lookups = Lookups()
    monkeypatch.setattr(cache.dbthread, "run", lookups.run)
    payloads = PayloadCache()
    first = await payloads.retry_policy("/t")
    assert first == DeliveryPolicy(30, 5, queue=False)
    assert await payloads.retry_policy("/t") == first
    assert lookups.calls == ["retry_policy"]
    await payloads.retry_policy("/u")  # another topic: its own lookup
    assert lookups.calls == ["retry_policy", "retry_policy"]


async def test_a_right_to_receive_is_remembered_a_while_and_a_refusal_never(monkeypatch):
    lookups = Lookups()
    monkeypatch.setattr(cache.dbthread, "run", lookups.run)
    monkeypatch.setattr(cache, "GRANT_MEMO_SECONDS", 3600)
    payloads = PayloadCache()
    assert await payloads.deliverable(42, 9, "/t") is True
    assert await payloads.deliverable(42, 10, "/t") is True  # remembered: no lookup
    assert lookups.calls == ["deliverable"]
    lookups.allowed = False
    assert await payloads.deliverable(43, 9, "/t") is False  # another account asks
    assert await payloads.deliverable(43, 9, "/t") is False  # and asks again
    assert lookups.calls == ["deliverable"] * 3
    # A yes past its memo time is asked again (and the answer may have changed).
    monkeypatch.setattr(cache, "GRANT_MEMO_SECONDS", 0)
    lookups.allowed = True
    payloads = PayloadCache()
    assert await payloads.deliverable(42, 9, "/t") is True
    lookups.allowed = False
    assert await payloads.deliverable(42, 10, "/t") is False
    assert lookups.calls == ["deliverable"] * 5


async def test_a_miss_reads_ahead_and_the_next_messages_cost_no_lookup(monkeypatch):
    """A session working through a backlog: the first message not in memory is loaded with
    those published after it (read.load_ahead), one lookup for the lot."""
    calls: list[tuple] = []

    async def run(fn, *args):
        calls.append((fn.__name__, *args))
        first = args[0]
        return {smuid: ("/q", f"c/{smuid}", message(f"m{smuid}", b"x"))
                for smuid in range(first, first + 3)}

    monkeypatch.setattr(cache.dbthread, "run", run)
    payloads = PayloadCache()
    assert (await payloads.load(10))[1] == "c/10"
    assert (await payloads.load(11))[1] == "c/11"
    assert (await payloads.load(12))[2] == message("m12", b"x")
    assert calls == [("load_ahead", 10, cache.READ_AHEAD, cache.READ_AHEAD_BYTES)]
    await payloads.load(13)  # past what was read ahead: a lookup of its own
    assert [c[:2] for c in calls] == [("load_ahead", 10), ("load_ahead", 13)]
