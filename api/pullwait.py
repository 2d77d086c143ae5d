"""A long-polling pull waits for the dispatcher's wake-up (a message committed for its
account, in any process: the dispatch group), not in a sleep loop. The pull view runs in a
worker thread; the dispatcher lives on Daphne's event loop, so the waiter is a
``threading.Event`` the loop sets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from broker.delivery import Dispatcher, get_dispatcher

#: Registering with the dispatcher includes joining the dispatch group (bounded there).
REGISTER_TIMEOUT = 10.0


class PullWakeups:
    """The event loop's dispatcher, for the pull view's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatcher: Dispatcher) -> None:
        self.loop = loop
        self.dispatcher = dispatcher

    @classmethod
    def here(cls) -> PullWakeups:
        """For the running loop (call on it)."""
        return cls(asyncio.get_running_loop(), get_dispatcher())

    def count(self, kind: str, n: int = 1) -> None:
        """Count with the dispatcher's own rates (written to Redis with them, every
        second), not with a Redis round trip of this request's own."""
        self.loop.call_soon_threadsafe(self.dispatcher.metrics.count, kind, n)

    @contextmanager
    def watching(self, account_id: int) -> Iterator[threading.Event]:
        """An event set whenever a message is offered to the account, from the moment this
        returns (it is a member of the dispatch group then) until the block ends."""
        event = threading.Event()
        wake = event.set

        async def watch() -> None:
            self.dispatcher.watch(account_id, wake)
            await self.dispatcher.joined()

        asyncio.run_coroutine_threadsafe(watch(), self.loop).result(REGISTER_TIMEOUT)
        try:
            yield event
        finally:
            self.loop.call_soon_threadsafe(self.dispatcher.unwatch, account_id, wake)


@contextmanager
def no_wakeups(account_id: int) -> Iterator[threading.Event]:
    """Without an event loop's dispatcher (the view called directly): never set."""
    yield threading.Event()
