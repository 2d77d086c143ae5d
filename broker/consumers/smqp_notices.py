"""What an SMQP session is told unasked: the services' account notifications (any process) as
NOTIFY lines, and which accounts want NOTIFY SERVER TIMEOUT before a shutdown. Wire forms
only; the door (:mod:`broker.consumers.smqp`) decides when they go."""

from __future__ import annotations

import asyncio
import logging

from broker.services import subscriptions as subscription_service
from broker.smqp.replies import (
    serialize_notify_server_timeout,
    serialize_notify_sub,
    serialize_notify_subscription,
    serialize_notify_topic,
)
from broker.store import dbthread

logger = logging.getLogger("broker.smqp")


def notification(event: dict) -> bytes | None:
    """The NOTIFY lines of an account notification (:mod:`broker.services.notify`'s
    ``kind`` and fields); None for a kind that is not written as one (``close`` is the
    door's to act on)."""
    kind = event["kind"]
    if kind == "topic":
        return serialize_notify_topic(event["topic"], event["action"], event.get("value"))
    if kind == "sub":
        return serialize_notify_sub(event["topic"], event["count"])
    if kind == "server_timeout":
        return serialize_notify_server_timeout(event["timeout"])
    if kind == "subscription":
        return serialize_notify_subscription(event["pattern"], event["action"],
                                             event["reason"])
    return None


_watchers: tuple[float, asyncio.Future] | None = None


async def server_timeout_watchers() -> set[int]:
    """Accounts with SUB SERVER TIMEOUT, read once for all the sessions of this process that
    ask within a second (a shutdown asks for every session at once); none if unreadable."""
    global _watchers
    loop = asyncio.get_running_loop()
    if _watchers is None or _watchers[0] < loop.time() or _watchers[1].get_loop() is not loop:
        _watchers = (loop.time() + 1.0, asyncio.ensure_future(dbthread.run(
            lambda: set(subscription_service.server_timeout_watchers()))))
    try:
        return await asyncio.shield(_watchers[1])
    except Exception:
        logger.warning("SUB SERVER TIMEOUT subscribers unreadable", exc_info=True)
        return set()
