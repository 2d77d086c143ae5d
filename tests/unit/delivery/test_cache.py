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
