"""Wake-ups and presence: committed messages offered to the sessions of this process, and
told to the other processes on the dispatch group (Redis, through the Channels layer), which
each process reads, says hello on, and learns of its peers by.

One wake-up per topic per batch on the group ``smqp-dispatch``; see PEER_HELLO_SECONDS for
when a process tells the others at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from channels.layers import get_channel_layer

from broker.services.notify import DISPATCH_GROUP
from broker.services.publish import Published

logger = logging.getLogger("broker.delivery")

# After a batch of cross-process wake-ups is sent, the next gathers for this long: under a
# stream of small commits the channel layer then costs a few hundred round trips a second at
# most, and another process hears of a message this much later at worst.
WAKE_GATHER_SECONDS = 0.005
# Wake-ups go to the other processes only while there are any: every dispatcher says hello
# on the dispatch group when it joins and every PEER_HELLO_SECONDS after, answers a hello
# from a process it did not know with its own at once, and forgets a process it has not
# heard from for PEER_FORGET_SECONDS. For its first PEER_STARTUP_SECONDS a dispatcher sends
# its wake-ups whether or not it has heard of another (their hellos are on their way). A
# listener alone (the common case) then spends nothing on wake-ups nobody reads. Another
# process learns of a new one a moment after it joined, by its hello: a commit there in
# that moment is not announced to it, and reaches its sessions by a backlog read (a
# dispatcher's first sweep comes PEER_STARTUP_SECONDS after it starts, not a period).
PEER_HELLO_SECONDS = 5.0
PEER_FORGET_SECONDS = 16.0
PEER_STARTUP_SECONDS = 2.0
# How long a login waits for its process to have joined the dispatch group (Redis slow or
# down: the login goes on, and the backlog sweep covers what a missed wake-up delays).
JOIN_WAIT_SECONDS = 1.0


class WakeUps:
    """One dispatcher's place on the dispatch group. ``offer`` and ``withdraw`` are the
    dispatcher's (:meth:`broker.delivery.dispatcher.Dispatcher.offer`, ``.withdraw``): what
    the other processes announce goes to them, and so do this process's own commits."""

    def __init__(self, origin: str,
                 offer: Callable[[Iterable[tuple[int, int, Iterable[int]]], float | None],
                                 None],
                 withdraw: Callable[[Iterable[tuple[int, int]]], None]) -> None:
        self.origin = origin
        self._offer = offer
        self._withdraw = withdraw
        self._outgoing: defaultdict[int, list[list]] = defaultdict(list)
        self._sender: asyncio.Task | None = None
        self._joined = asyncio.get_running_loop().create_future()
        # Other processes on the dispatch group: origin → when last heard of (loop time).
        self._peers: dict[str, float] = {}
        self._startup_until = asyncio.get_running_loop().time() + PEER_STARTUP_SECONDS
        self._greeter: asyncio.Task | None = None
        self._listener = asyncio.ensure_future(self._listen_loop())

    def wake(self, published: list[Published]) -> None:
        """Offer committed messages here, and tell the other processes: one message per topic
        per batch. While a batch of wake-ups is on its way to Redis the next ones gather, so
        a stream of small commits costs one channel-layer round trip at a time, not one each
        (another process hears of a message at most one round trip later)."""
        if not published:
            return
        self._offer(((p.priority, p.smuid, p.accounts) for p in published), None)
        if not self._has_peers():
            return
        for p in published:
            if p.accounts:
                self._outgoing[p.topic_id].append([p.priority, p.smuid, p.accounts])
        if self._outgoing and (self._sender is None or self._sender.done()):
            self._sender = asyncio.ensure_future(self._send_wakeups())
            self._sender.add_done_callback(_log_failure)

    async def _send_wakeups(self) -> None:
        layer = get_channel_layer()
        while self._outgoing:
            batch, self._outgoing = self._outgoing, defaultdict(list)
            if layer is None:
                continue
            await asyncio.gather(*(
                layer.group_send(DISPATCH_GROUP, {"type": "dispatch.wake", "origin": self.origin,
                                                  "items": items, "at": time.time()})
                for items in batch.values()))
            await asyncio.sleep(WAKE_GATHER_SECONDS)

    def _has_peers(self) -> bool:
        """May another process read wake-ups (see PEER_HELLO_SECONDS)?"""
        now = asyncio.get_running_loop().time()
        if now < self._startup_until:
            return True
        for origin, heard in list(self._peers.items()):
            if now - heard <= PEER_FORGET_SECONDS:
                return True
            del self._peers[origin]
        return False

    async def _hello(self) -> None:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(DISPATCH_GROUP, {"type": "dispatch.hello",
                                                    "origin": self.origin})

    async def _greet_loop(self) -> None:
        """Say hello on the dispatch group every PEER_HELLO_SECONDS (Redis down: later)."""
        while True:
            try:
                await self._hello()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("saying hello on the dispatch group failed; trying again later")
            await asyncio.sleep(PEER_HELLO_SECONDS)

    def _heard_from(self, origin: str, kind: str) -> None:
        """A message from another process (a hello, a wake-up): it reads the group too."""
        now = asyncio.get_running_loop().time()
        heard = self._peers.get(origin)
        self._peers[origin] = now
        if kind == "dispatch.hello" and (heard is None or now - heard > PEER_FORGET_SECONDS):
            # A process that just joined learns of this one now, not a hello period later.
            answer = asyncio.ensure_future(self._hello())
            answer.add_done_callback(_log_failure)

    async def joined(self) -> None:
        """Returns once this process reads the dispatch group (or after JOIN_WAIT_SECONDS):
        a session reads its backlog after that, so what is committed later reaches it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._joined), JOIN_WAIT_SECONDS)

    async def _listen_loop(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            self._joined.set_result(None)
            return
        loop = asyncio.get_running_loop()
        # The default prefix: channels-redis then serves this channel and every consumer's
        # from one shared receive loop (a second prefix would make them take turns).
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(DISPATCH_GROUP, channel)
                break
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis down at start: keep trying, never give up listening
                logger.exception("joining the dispatch group failed; retrying")
                await asyncio.sleep(1)
        joined = loop.time()
        self._joined.set_result(None)
        self._greeter = asyncio.ensure_future(self._greet_loop())
        while True:
            try:
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                await asyncio.sleep(1)
                continue
            origin = event.get("origin")
            if origin and origin != self.origin:
                self._heard_from(origin, event.get("type", ""))
            if event.get("type") == "dispatch.wake" and origin != self.origin:
                self._offer(((p, s, a) for p, s, a in event["items"]), event.get("at"))
            elif event.get("type") == "dispatch.withdraw":
                self._withdraw(event["items"])
            if loop.time() - joined > 600:  # groups expire in Redis; stay a member
                try:
                    await layer.group_add(DISPATCH_GROUP, channel)
                    joined = loop.time()
                except Exception:
                    logger.exception("renewing the dispatch group failed; retrying later")

    def close(self) -> None:
        for task in (self._listener, self._sender, self._greeter):
            if task is not None:
                task.cancel()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("wake-up through the channel layer failed", exc_info=task.exception())
