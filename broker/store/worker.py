"""Storage processes, the child's side: answer a listener's calls on a socket (:mod:`.lanes`).

The calls are given by the program that runs this (:func:`main`): the store runs no rules of
its own. Each call runs as the listener's database thread would run it
(:func:`.dbthread.call_here`), after dropping the cached topic tree and access snapshots if
the listener changed them since the last call.

On SQLite a storage process commits without waiting for the disk and flushes the WAL itself
before it answers a call that must be durable (:meth:`.backends.Backend.open_for_storage`):
an ACK queued behind a publish does not wait for that flush, and one flush serves every
publish batch committed before it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .dbthread import call_here
from .frames import LENGTH, take_frame

if TYPE_CHECKING:
    from .backends import Backend

logger = logging.getLogger("broker.store.worker")

#: Longest an answer waits for the WAL flush while further calls keep coming (see
#: :func:`serve`).
FLUSH_WITHIN = 0.002
#: A call at least this large (its frame, in bytes: a publish batch of some 50 small
#: messages) takes long enough to commit that the answers owed are flushed and sent
#: before it rather than after (see :func:`serve`).
LONG_CALL_BYTES = 32 * 1024

#: The calls a storage process answers, by name.
Calls = Mapping[str, Callable[..., Any]]


class _Inbox:
    """The frames the listener sends, read off the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()

    def _receive(self, *, wait: bool) -> bool:
        """Read what has come (with ``wait``, once something has); False when nothing had.
        Raises EOFError when the socket closed."""
        try:
            data = self._sock.recv(1 << 20, 0 if wait else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if not data:
            raise EOFError
        self._buffer += data
        return True

    def next_size(self) -> int | None:
        """The size of the next frame, once its length has come (without waiting)."""
        if len(self._buffer) < LENGTH.size:
            with contextlib.suppress(EOFError):  # get() says so, when it is asked next
                self._receive(wait=False)
            if len(self._buffer) < LENGTH.size:
                return None
        return LENGTH.unpack_from(self._buffer)[0]

    def get(self, *, wait: bool) -> bytes | None:
        """The next frame; None when ``wait`` is false and no whole frame has come yet.
        Raises EOFError when the socket closed."""
        while (frame := take_frame(self._buffer)) is None:
            if not self._receive(wait=wait):
                return None
        return frame


def serve(fd: int, database: str, calls: Calls, durable: Callable[[str], bool]) -> None:
    """Answer calls on the socket ``fd`` until it closes.

    With a WAL to flush, the answers of durable calls (``durable(name)``: their commit must
    be on disk before the answer goes) wait in ``owed`` while more calls are already waiting
    (at most :data:`FLUSH_WITHIN` seconds): those commit first, then one flush covers them
    all, and the answers go. Not a long call (:data:`LONG_CALL_BYTES`, a large publish
    batch): the answers owed are flushed and sent before it, so that they do not wait for
    its commit, and the listener sends the next batch meanwhile. An answer that needs no
    flush (a failed call, a relaxed ACK) goes at once, before them: the listener matches
    answers to calls by their numbers."""
    from django.db import connection

    from .backends import backend

    connection.settings_dict["NAME"] = database
    store = backend()
    wal = store.open_for_storage(database)
    sock = socket.socket(fileno=fd)
    inbox = _Inbox(sock)
    owed: list[bytes] = []
    owed_since = 0.0
    seen: list[int | None] = [None, None]
    try:
        while True:
            if owed and (time.monotonic() - owed_since >= FLUSH_WITHIN
                         or (inbox.next_size() or 0) >= LONG_CALL_BYTES):
                frame = None
            else:
                try:
                    frame = inbox.get(wait=not owed)
                except EOFError:
                    return
            if frame is None:  # nothing more queued, or a long call: flush, then answer
                assert wal is not None
                _flush(wal)
                sock.sendall(b"".join(owed))
                owed.clear()
                continue
            call_id, name, args, generations = pickle.loads(frame)
            store.before_storage_call()
            ok, data = _answer(calls, call_id, name, args, generations, seen)
            # A failed call committed nothing: its answer needs no flush.
            if wal is not None and ok and durable(name):
                if not owed:
                    owed_since = time.monotonic()
                owed.append(data)
            else:
                sock.sendall(data)
            if not owed:
                _keep_statistics(store)
    except OSError:  # the listener is gone
        return


def _keep_statistics(store: Backend) -> None:
    """The store's statistics kept between calls; a failure there (the database gone in a
    failover) is the next call's to meet and answer, not this process's end."""
    from django.db import connection

    try:
        store.keep_statistics()
    except Exception:
        logger.warning("keeping the planner's statistics failed", exc_info=True)
        connection.close_if_unusable_or_obsolete()


def _answer(calls: Calls, call_id: int, name: str, args: tuple,
            generations: tuple[int, int], seen: list[int | None]) -> tuple[bool, bytes]:
    """Run one call; (whether it succeeded, its answer as a frame)."""
    try:
        _follow(generations, seen)
        reply: tuple[int, bool, Any] = (call_id, True, call_here(calls[name], *args))
    except Exception as exc:
        logger.exception("storage call %s failed", name)
        reply = (call_id, False, exc)
    try:
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: say what it was
        data = pickle.dumps((call_id, False, RuntimeError(repr(reply[2]))))
    return reply[1], LENGTH.pack(len(data)) + data


def _follow(generations: tuple[int, int], seen: list[int | None]) -> None:
    """Drop the cached topic tree / access snapshots when the listener changed them."""
    from topics import tree
    from ual import resolution

    if generations[0] != seen[0]:
        tree.invalidate_local()
    if generations[1] != seen[1]:
        resolution.invalidate_local()
    seen[:] = generations


class _FlushFailed(Exception):
    """The WAL flush failed: the storage process ends."""


def _flush(wal: str) -> None:
    """fdatasync the WAL: what was committed before is on disk after."""
    try:
        fd = os.open(wal, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        # After a failed flush the page cache cannot be trusted to reach the disk: the
        # process ends without answering (the listener says the outcome is unknown), and
        # the next call starts one with a new connection.
        raise _FlushFailed(f"flushing {wal} failed: {exc}") from exc


def start_django() -> None:
    """Load Django in a storage process (before its calls' modules are imported)."""
    # Ctrl-C reaches the whole process group: the listener stops first and closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    import django

    django.setup()


def main(argv: list[str], calls: Calls, durable: Callable[[str], bool]) -> None:
    """Serve ``calls`` on the socket and database named by ``argv`` (``<fd> <database>``),
    once Django is loaded (:func:`start_django`) and the calls' modules imported."""
    from broker.heap import freeze_startup

    freeze_startup()
    serve(int(argv[0]), argv[1], calls, durable)
