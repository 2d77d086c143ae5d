"""What every Channels door shares: the ASGI loop, the channel layer's events, one error
funnel, and the rule that a session ends with its transport.

The connection's own events are awaited directly: Channels' ``await_many_dispatch`` makes a
task and an ``asyncio.wait`` for every event (a subscriber's every 310 ACK, a publisher's
every PUB). The channel layer's events (account notifications) come from a task of their
own; a lock (``_turn``) keeps the handlers one at a time, as there.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer

from broker.delivery.session import SubscriberSession
from broker.services import notify
from broker.store import dbthread
from ual.resolution import snapshot_for


class DoorConsumer(AsyncConsumer):
    """One connection of a door. Subclasses set :attr:`logger`, handle their events by
    Channels' handler names (``smqp_receive``, ``websocket_receive``, ...) and end their
    session in :meth:`end_session`, which is called once the loop ends whatever ended it."""

    logger = logging.getLogger("broker")
    peer = "?"
    #: The subscriber session (broker.delivery.session), made when the connection opens.
    delivery: SubscriberSession | None = None
    _ending: asyncio.Future | None = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        self._turn = asyncio.Lock()
        layer_events: asyncio.Task | None = None
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            self.channel_receive = functools.partial(self.channel_layer.receive,
                                                     self.channel_name)
            layer_events = asyncio.ensure_future(self._layer_events())
        try:
            while True:
                event = await receive()
                async with self._turn:
                    await self.dispatch(event)
        except StopConsumer:
            pass
        finally:
            if layer_events is not None:
                layer_events.cancel()
            # Whatever ended the loop (the disconnect, an exception, the server cancelling
            # this instance), the session ends with it: never a live session without its
            # transport. Shielded: a cancelled instance still releases its locks.
            await asyncio.shield(self.end_session())

    async def _layer_events(self) -> None:
        while True:
            event = await self.channel_receive()
            async with self._turn:
                try:
                    await self.dispatch(event)
                except Exception:  # the session goes on: only this notification is lost
                    self.failed(f"channel layer event {event.get('type')}")

    async def dispatch(self, message: dict) -> None:
        """Call the event's handler. Channels' own ``dispatch`` first hops to the database
        thread to close stale connections, on every event; here every database call
        (:mod:`broker.store.dbthread`) does that itself, so that hop only made each incoming
        event wait behind whatever commit was running."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            self.logger.warning("no handler for event %s", message.get("type"))
            return
        await handler(message)

    async def end_session(self) -> None:
        """The transport ended (by whatever path): the session ends and its locks go back;
        once (called from every end). A door sets ``_ended = False`` once connected. The
        ending runs as a task of its own that every caller awaits shielded: a caller
        cancelled meanwhile (Daphne kills an instance slow to stop) does not stop it half
        way, with the session marked ended and its locks and login still held."""
        if self._ending is None:
            if getattr(self, "_ended", True):  # not connected
                return
            self._ended = True
            self._ending = asyncio.ensure_future(self._end_session())
        await asyncio.shield(self._ending)

    async def _end_session(self) -> None:
        self.closing = True
        self.stop_door()
        await self.delivery.close()
        if getattr(self, "account", None) is not None and self.channel_layer is not None:
            try:
                await self.channel_layer.group_discard(notify.account_group(self.account_id),
                                                       self.channel_name)
            except Exception:  # the group expires in Redis; the session ends all the same
                self.logger.warning("leaving the account group failed for %s", self.peer,
                                    exc_info=True)

    def stop_door(self) -> None:
        """The door's own timers and tasks stop (the session is ending)."""

    # ------------------------------------------------------------------ the error funnel

    def failed(self, what: str, exc: BaseException | None = None) -> None:
        """Log a failure of this connection's work that ends nothing but itself."""
        self.logger.error("%s failed for %s", what, self.peer,
                          exc_info=exc if exc is not None else True)

    async def _as_account(self, fn: Callable, *args: Any) -> Any:
        """Run a service function in the database thread with this session's account access
        snapshot (cached per process, rebuilt after any change that can alter a decision)."""

        def run() -> Any:
            return fn(snapshot_for(self.account), *args)

        return await dbthread.run(run)

    def spawn(self, coro: Coroutine, what: str) -> asyncio.Task:
        """Run ``coro`` beside the handlers; its failure goes to :meth:`failed`."""
        task = asyncio.ensure_future(coro)
        tasks = self.__dict__.setdefault("_tasks", set())  # (kept: the loop holds weak refs)
        tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))
        return task

    def _task_done(self, what: str, task: asyncio.Task) -> None:
        self.__dict__.get("_tasks", set()).discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failed(what, task.exception())

    # ---------------------------------------------- the session, as the dispatcher sees it
    # (a door whose login registers the door itself with the dispatcher forwards to it)

    @property
    def account_id(self) -> int:
        return self.delivery.account_id

    @account_id.setter
    def account_id(self, value: int) -> None:
        self.delivery.account_id = value

    @property
    def session(self) -> Any:
        """The LoginSession (accounts.models), None before login and once ended."""
        return self.delivery.session if self.delivery is not None else None

    @session.setter
    def session(self, value: Any) -> None:
        self.delivery.session = value

    @property
    def dispatcher(self) -> Any:
        return self.delivery.dispatcher

    @dispatcher.setter
    def dispatcher(self, value: Any) -> None:
        self.delivery.dispatcher = value

    @property
    def mailbox(self) -> Any:
        return self.delivery.mailbox

    @property
    def idle(self) -> bool:
        return self.delivery.idle

    def kick(self) -> None:
        self.delivery.kick()
