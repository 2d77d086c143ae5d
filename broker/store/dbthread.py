"""The SMQP listener's database thread.

Every database call of the listener (sessions, commands, the dispatcher's group commits)
runs here, on one thread that holds the process's one database connection, as
``database_sync_to_async`` would run it on asgiref's shared sync thread. The difference is
the cost of the hop: asgiref copies and restores context variables and wraps every call in
its thread-sensitivity machinery, and the listener makes two such hops per delivered message
(its ACK and its publish). On PostgreSQL, ACK batches have a thread (and connection) of
their own: :func:`run_ack`. The group commits themselves normally run in storage processes
(:mod:`broker.store.lanes`); these threads run them when those are turned off.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import close_old_connections, connection

from .backends import Unsent, backend

T = TypeVar("T")

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smqp-db")
_ack_executor: ThreadPoolExecutor | None = None


def call_here(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on this thread's connection, as the database thread runs it."""
    # As Channels does around each call: drop a connection that broke or outlived
    # CONN_MAX_AGE, before and after, so the next call gets a working one. Not while a
    # transaction is held open between two calls (a storage process's publish batch held
    # before its COMMIT: broker.services.storage_calls).
    if not connection.in_atomic_block:
        close_old_connections()
    try:
        try:
            return fn(*args, **kwargs)
        except Unsent:
            # The connection had broken before anything was committed (the database
            # restarted): once more, on a new one.
            connection.close()
            return fn(*args, **kwargs)
    finally:
        if not connection.in_atomic_block:
            close_old_connections()


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the database thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, functools.partial(call_here, fn, *args, **kwargs))


def acks_apart() -> bool:
    """Do ACK batches commit on a thread and connection of their own? On PostgreSQL, yes: a
    subscriber's ACK (and so its next NOTIFY) then never waits for a publish transaction
    that is committing, the two run side by side. On SQLite, no: it has one writer, and a
    second connection would wait for the lock in its busy handler instead of in this queue
    (:attr:`.backends.Backend.acks_apart`)."""
    return backend().acks_apart


async def run_ack(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the ACK thread (:func:`acks_apart`), else on the database thread."""
    global _ack_executor
    if not acks_apart():
        return await run(fn, *args)
    if _ack_executor is None:
        _ack_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smqp-db-ack")
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_ack_executor, functools.partial(call_here, fn, *args))
