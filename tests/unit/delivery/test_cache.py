"""The dispatcher's cache of committed messages, kept for NOTIFY (:mod:`broker.delivery`).

An entry is one bytes object, which the garbage collector never tracks: a full cache must
not be hundreds of thousands of objects for every full collection to walk while the
listener stands still. The rest of the behaviour (what NOTIFY sends) is tested
end to end over sockets; here, the cache itself, without a running dispatcher.
"""

from __future__ import annotations

import gc
from collections import OrderedDict

from broker.delivery import dispatcher as delivery
from broker.smqp.message import DataSection, Message


def bare_dispatcher() -> delivery.Dispatcher:
    """A dispatcher with only its cache (no storage processes, no channel layer)."""
    dispatcher = delivery.Dispatcher.__new__(delivery.Dispatcher)
    dispatcher._cache = OrderedDict()
    dispatcher._cache_bytes = 0
    return dispatcher


def message(tag: str, *bodies: bytes) -> Message:
    return Message([("Name", tag), ("Priority", "2"), ("X-Trace", f"t-{tag}")],
                   [DataSection([("Content-Type", "application/octet-stream"),
                                 ("X-Part", str(i))], body)
                    for i, body in enumerate(bodies)])


async def test_a_remembered_message_comes_back_whole_and_as_a_copy():
    dispatcher = bare_dispatcher()
    original = message("m1", b"\x00\x01binary", b"", b"third")
    dispatcher._remember(7, ("/t/a", "c/1/2", original))

    path, cmuid, loaded = await dispatcher.load(7)
    assert (path, cmuid) == ("/t/a", "c/1/2")
    assert loaded == original and loaded is not original
    # What a caller does to its copy never reaches the cache.
    loaded.headers.append(("X-Mine", "1"))
    loaded.sections[0].headers.clear()
    assert (await dispatcher.load(7))[2] == original


async def test_cache_entries_are_not_tracked_by_the_garbage_collector():
    dispatcher = bare_dispatcher()
    for smuid in range(200):
        dispatcher._remember(smuid, ("/t", f"c/{smuid}", message(str(smuid), b"x" * 64)))
    # Not even before a collection has looked at them: nothing for one to walk.
    assert [smuid for smuid, entry in dispatcher._cache.items() if gc.is_tracked(entry)] == []
    # The codec objects, by contrast, are tracked: this is what the entries avoid.
    assert gc.is_tracked(message("m", b"x"))


async def test_the_oldest_entries_go_once_the_cache_is_over_its_bytes(monkeypatch):
    entry_size = delivery._entry_size(delivery._pack(("/t", "c/0", message("0", b"x" * 100))))
    monkeypatch.setattr(delivery, "CACHE_BYTES", 3 * entry_size)
    dispatcher = bare_dispatcher()
    for smuid in range(5):
        dispatcher._remember(smuid, ("/t", f"c/{smuid}", message(str(smuid), b"x" * 100)))
    assert list(dispatcher._cache) == [2, 3, 4]
    assert dispatcher._cache_bytes == 3 * entry_size
