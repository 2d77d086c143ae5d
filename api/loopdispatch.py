"""The REST views run in worker threads; the dispatcher lives on Daphne's event loop. This is
the hop between them:

* a long-polling pull waits for the dispatcher's wake-up (a message committed for its
  account, in any process: the dispatch group), not in a sleep loop: the waiter is a
  ``threading.Event`` the loop sets;
* a publish joins the dispatcher's group commit, as an SMQP or XMPP publish does: concurrent
  requests share one transaction and one flush, on the storage processes (on SQLite the one
  writer), instead of each request's own transaction racing the others for the write lock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from broker.delivery import Dispatcher, get_dispatcher
from broker.services.prepare import PublishRequest
from broker.services.publish import Published

#: Registering with the dispatcher includes joining the dispatch group (bounded there).
REGISTER_TIMEOUT = 10.0


class LoopDispatcher:
    """The event loop's dispatcher, for a view's thread. The dispatcher is looked up on the
    loop when first used: a request that needs none does not create it."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 dispatcher: Dispatcher | None = None) -> None:
        self.loop = loop
        self._dispatcher = dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        """(On the loop only.)"""
        if self._dispatcher is None:
            self._dispatcher = get_dispatcher()
        return self._dispatcher

    def count(self, kind: str, n: int = 1) -> None:
        """Count with the dispatcher's own rates (written to Redis with them, every
        second), not with a Redis round trip of this request's own."""
        self.loop.call_soon_threadsafe(lambda: self.dispatcher.metrics.count(kind, n))

    def publish(self, request: PublishRequest) -> Published:
        """The message committed in the dispatcher's next group commit (which also counts
        it and tells the subscribers of every process); raises the ServiceError that
        refused it."""

        async def committed() -> Published:
            return await self.dispatcher.publish(request)

        return asyncio.run_coroutine_threadsafe(committed(), self.loop).result()

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
            self.loop.call_soon_threadsafe(lambda: self.dispatcher.unwatch(account_id, wake))


@contextmanager
def no_wakeups(account_id: int) -> Iterator[threading.Event]:
    """Without an event loop's dispatcher (the view called directly): never set."""
    yield threading.Event()
