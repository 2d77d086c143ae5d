"""Storage processes: the listener's group commits, run in processes of their own.

The listener is one Python process: its event loop (parsing, replies, NOTIFY) and its
database thread share one GIL, so together they never use more than one core, while the
machine has more. The two hot calls, :func:`~broker.services.messages.publish_batch` and
:func:`~broker.services.messages.ack_batch`, hold half of that core: each has a *lane*, a
child process (``python -m broker.store.storage``) with a database connection of its own, fed over
a socket pair. The rules stay in the services layer; only where they run changes.

Lanes: on SQLite one for both (one writer; a second would wait for the lock in its busy
handler), on PostgreSQL two for publishes (one builds a batch while the other commits the
one before it: :meth:`Storage._publish_held`) and one for ACKs, which commit side by side.

A call carries the listener's local cache generations (topic tree, access snapshots), so a
change this process made (CREATE TOPIC, a UAL edit) is seen by the next batch at once, not a
poll interval later. A child ends when its socket closes (the listener stopped or died); a
child that ends with calls outstanding fails them with :class:`StorageLost`, whose outcome
is unknown (the batch may have committed just before), and the next call starts a new one.

On SQLite a storage process commits without waiting for the disk and flushes the WAL
itself before it answers a publish (:func:`flush_behind`): an ACK queued behind a publish
does not wait for that flush, and one flush serves every publish batch committed before it.

A frame is an 8-byte big-endian length and a pickle: a call (number, name, arguments, cache
generations), or its answer (number, ok, result or exception). Answers may come in another
order than the calls. Both ends are this program: the pickles never cross a trust boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from broker.domain.message import Message

if TYPE_CHECKING:
    from broker.services.messages import AckRequest, Published, PublishRequest

logger = logging.getLogger("broker.store.storage")

_LENGTH = struct.Struct("!Q")
#: Least time between two starts of one lane's process.
RESTART_SECONDS = 1.0
#: Publish batches on their way to a storage process that flushes the WAL itself (SQLite):
#: it finds the next one queued when it has answered one, instead of idling until the
#: listener sends it (see :attr:`Storage.publish_window` for when more than two go).
PUBLISHES_IN_FLIGHT = 4
#: Publishes that make a batch worth sending while two are on their way already (SQLite).
EXTRA_BATCH_MIN = 32
#: Publishes that make a batch worth PostgreSQL's second publish lane.
SECOND_LANE_MIN = 128
#: Longest an answer waits for the WAL flush while further calls keep coming (see
#: :func:`serve`).
FLUSH_WITHIN = 0.002
#: A call at least this large (its frame, in bytes: a publish batch of some 50 small
#: messages) takes long enough to commit that the answers owed are flushed and sent
#: before it rather than after (see :func:`serve`).
LONG_CALL_BYTES = 32 * 1024


def take_frame(buffer: bytearray) -> bytes | None:
    """The first whole frame's pickle, taken out of ``buffer``; None while it is partial."""
    if len(buffer) < _LENGTH.size:
        return None
    end = _LENGTH.size + _LENGTH.unpack_from(buffer)[0]
    if len(buffer) < end:
        return None
    frame = bytes(memoryview(buffer)[_LENGTH.size:end])
    del buffer[:end]
    return frame


class StorageLost(Exception):
    """The storage process ended before it answered: the call may or may not have
    committed."""


# ------------------------------------------------------------------------ the listener


class _Reader(asyncio.Protocol):
    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (frame := take_frame(self.buffer)) is not None:
            self.lane.answered(*pickle.loads(frame))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lane.lost()


class Lane:
    """One storage process and the calls waiting for it (answered in the order sent)."""

    def __init__(self, name: str, database: str) -> None:
        self.name = name
        self.database = database
        self._transport: asyncio.Transport | None = None
        self._process: subprocess.Popen | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._starting: asyncio.Future | None = None
        self._next_start = float("-inf")

    async def call(self, name: str, *args: Any) -> Any:
        """``CALLS[name](*args)`` in the storage process; raises what it raised."""
        if self._transport is None:
            await self._start()
        assert self._transport is not None
        if self._transport.is_closing():  # it ended; connection_lost() has yet to run
            raise StorageLost(f"storage process {self.name} ended")
        future = asyncio.get_running_loop().create_future()
        call_id = next(self._ids)
        data = pickle.dumps((call_id, name, args, _generations()),
                            protocol=pickle.HIGHEST_PROTOCOL)
        self._transport.writelines((_LENGTH.pack(len(data)), data))
        self._waiting[call_id] = future
        ok, value = await future
        if ok:
            return value
        raise value

    def prestart(self) -> None:
        if self._transport is None and self._starting is None:
            self._starting = asyncio.ensure_future(self._spawn())
            self._starting.add_done_callback(self._started)

    def _started(self, task: asyncio.Future) -> None:
        if self._starting is task:
            self._starting = None
        if not task.cancelled() and task.exception() is not None:
            logger.error("storage process %s did not start", self.name,
                         exc_info=task.exception())

    async def _start(self) -> None:
        self.prestart()
        if self._starting is not None:
            await asyncio.shield(self._starting)
        if self._transport is None:
            raise StorageLost(f"storage process {self.name} did not start")

    async def _spawn(self) -> None:
        from django.conf import settings

        loop = asyncio.get_running_loop()
        # A process that keeps ending at once (a broken install) is started once a second.
        await asyncio.sleep(max(0.0, self._next_start - loop.time()))
        self._next_start = loop.time() + RESTART_SECONDS
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get(
            "DJANGO_SETTINGS_MODULE", "broker.settings")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(settings.BASE_DIR), env.get("PYTHONPATH")) if p)
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "broker.store.storage", str(theirs.fileno()), self.database],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        transport, _ = await loop.create_connection(lambda: _Reader(self), sock=ours)
        self._transport = transport  # type: ignore[assignment]
        logger.info("storage process %s started (pid %d)", self.name, self._process.pid)

    def answered(self, call_id: int, ok: bool, value: Any) -> None:
        future = self._waiting.pop(call_id)
        if not future.done():
            future.set_result((ok, value))

    def lost(self) -> None:
        self._transport = None
        process, self._process = self._process, None
        waiting, self._waiting = self._waiting, {}
        if waiting:
            logger.error("storage process %s ended with %d call(s) unanswered",
                         self.name, len(waiting))
        for future in waiting.values():
            if not future.done():
                future.set_result((False, StorageLost(f"storage process {self.name} ended")))
        if process is not None:
            asyncio.get_running_loop().run_in_executor(None, process.wait)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Storage:
    """Where one listener's group commits run: its lanes, or (``SMQP_STORAGE_PROCESSES``
    off, or an in-memory database no other process can open) the database threads."""

    def __init__(self) -> None:
        from django.db import connection

        from broker.store import dbthread

        self.apart = enabled()
        # The database this process uses, by name: a test's database is not the configured one.
        database = str(connection.settings_dict["NAME"])
        self._publish = Lane("publish", database)
        self._ack = Lane("ack", database) if dbthread.acks_apart() else self._publish
        # PostgreSQL: a second publish lane, so that one batch's rows are built while the
        # batch before commits (see _publish_held).
        self._held = self.apart and dbthread.acks_apart()
        self._publishers = [self._publish, Lane("publish-2", database)] if self._held \
            else [self._publish]
        self._lanes = tuple(dict.fromkeys((*self._publishers, self._ack)))
        self._idle_publishers = list(self._publishers)
        self._opening = asyncio.Lock()
        self._last_commit: asyncio.Future[None] | None = None
        #: How many publish batches the dispatcher may have on their way at once
        #: (:func:`broker.delivery._may_send`): (at most, whatever their size, beyond that
        #: only with this many publishes or more). SQLite, where the storage process flushes
        #: the WAL itself (:func:`flush_behind`): four, two, 32. PostgreSQL: two on its two
        #: publish lanes, the second only for a large batch (it costs a transaction and a
        #: process more: worth it while publishers keep far ahead of one lane, not for a
        #: trickle; measured, a second batch from 32 publishes cut e2e by a tenth, one from
        #: 128 did not). Else one.
        if self.apart and _flushes_behind(connection):
            self.publish_window = (PUBLISHES_IN_FLIGHT, 2, EXTRA_BATCH_MIN)
        elif self._held:
            self.publish_window = (2, 1, SECOND_LANE_MIN)
        else:
            self.publish_window = (1, 1, 0)

    def start(self) -> None:
        """Start the processes now (they take a moment to load Django): the first
        publish then finds them ready."""
        if self.apart:
            for lane in self._lanes:
                lane.prestart()

    async def ready(self) -> None:
        """Returns once every storage process serves (it loads Django first: about a
        second, which a publish sent earlier would wait out)."""
        if self.apart:
            await asyncio.gather(*(lane.call("ready") for lane in self._lanes))

    async def publish_batch(self, requests: list[PublishRequest]) -> list:
        from broker.services import messages
        from broker.store import dbthread

        if not self.apart:
            return await dbthread.run(messages.publish_batch, requests)
        if self._held:
            results = await self._publish_held(requests)
        else:
            results = await self._publish.call("publish_batch", requests)
        for request, result in zip(requests, results, strict=True):
            if isinstance(result, messages.Published) and result.payload is not None:
                path, cmuid, headers = result.payload
                result.payload = (path, cmuid, Message(headers, request.message.sections))
        return results

    async def _publish_held(self, requests: list[PublishRequest]) -> list:
        """PostgreSQL, two publish lanes: a batch runs up to its COMMIT on an idle lane
        (``publish_begin``: its rows built and sent, the transaction held open), then waits
        for the batch sent before it to have committed (or failed), then commits
        (``publish_commit``). So one lane builds a batch while the other commits one, and
        batches still commit in the order they were sent. They also begin in that order,
        one at a time: each takes its smuids from the sequence as it begins, so smuids grow
        in publish order, and a reader never sees a batch without the one before it.

        A small batch (fewer than SECOND_LANE_MIN publishes: no large one comes behind it,
        see publish_window) goes in one call, begun and committed, with no round trip
        between: the next batch begins after it."""
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[None] = loop.create_future()
        whole = len(requests) < SECOND_LANE_MIN
        async with self._opening:
            previous, self._last_commit = self._last_commit, mine
            lane = self._idle_publishers.pop(0)
            try:
                if whole:
                    await _committed(previous)
                    return await lane.call("publish_batch", requests)
                results = await lane.call("publish_begin", requests)
            except BaseException:
                whole = True
                raise
            finally:
                if whole:
                    self._idle_publishers.append(lane)
                    _settle(mine)
        try:
            await _committed(previous)
            await lane.call("publish_commit")
        finally:
            self._idle_publishers.append(lane)
            _settle(mine)
        return results

    async def ack_batch(self, acks: list[AckRequest]) -> list[Published]:
        from broker.services import messages
        from broker.store import dbthread

        if not self.apart:
            return await dbthread.run_ack(messages.ack_batch, acks)
        return await self._ack.call("ack_batch", acks)

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _committed(previous: asyncio.Future[None] | None) -> None:
    """Returns once the batch sent before has committed or failed."""
    if previous is not None:
        await asyncio.shield(previous)


def enabled() -> bool:
    """Do group commits run in storage processes? ``SMQP_STORAGE_PROCESSES`` (on by
    default), never for an in-memory SQLite database."""
    from django.conf import settings
    from django.db import connection

    if not settings.SMQP_STORAGE_PROCESSES:
        return False
    return not (connection.vendor == "sqlite" and connection.is_in_memory_db())


def _flushes_behind(connection: Any) -> bool:
    """Does a storage process on this database flush the WAL itself (:func:`flush_behind`)?"""
    from django.conf import settings

    return connection.vendor == "sqlite" and not connection.is_in_memory_db() and \
        settings.SMQP_SQLITE_SYNCHRONOUS in ("FULL", "EXTRA")


def _generations() -> tuple[int, int]:
    """This process's local cache generations (see the module docstring)."""
    from topics import tree
    from ual import resolution

    return tree.local_generation(), resolution.local_epoch()


# ------------------------------------------------------------------ the storage process


def _publish_batch(requests: list) -> list:
    """:func:`~broker.services.messages.publish_batch` without sending the data sections
    back: the listener has them (the request's) and puts them in again."""
    from broker.services.messages import publish_batch

    _abandon_held()
    return _without_sections(publish_batch(requests))


def _without_sections(results: list) -> list:
    from broker.services.messages import Published

    for result in results:
        if isinstance(result, Published) and result.payload is not None:
            path, cmuid, message = result.payload
            result.payload = (path, cmuid, message.headers)  # type: ignore[assignment]
    return results


#: The publish batch this process holds open before its COMMIT (see _publish_begin).
_held: Any = None


def _publish_begin(requests: list) -> list:
    """:func:`_publish_batch` up to its COMMIT: the transaction stays open until
    ``publish_commit`` (a batch still held is rolled back first: its listener gave up on it)."""
    global _held
    from broker.services.messages import publish_batch_held

    _abandon_held()
    held = publish_batch_held(requests)
    results = next(held)
    _held = held
    return _without_sections(results)


def _publish_commit() -> None:
    """COMMIT the batch :func:`_publish_begin` holds; raises what the COMMIT raised."""
    global _held
    from broker.store.rows import Unsent

    held, _held = _held, None
    if held is None:
        raise RuntimeError("no publish batch is held (nothing committed)")
    try:
        next(held, None)
    except Unsent as exc:  # the link broke before the COMMIT went out: nothing committed
        raise RuntimeError("database connection lost (nothing committed)") from exc


def _abandon_held() -> None:
    global _held
    held, _held = _held, None
    if held is not None:
        logger.warning("a held publish batch was never committed; rolled back")
        held.close()


def _ack_batch(acks: list) -> list:
    from broker.services.messages import ack_batch

    return ack_batch(acks)


def _ready() -> None:
    """Answered once the process serves: Django and the services are loaded."""


CALLS = {"publish_batch": _publish_batch, "publish_begin": _publish_begin,
         "publish_commit": _publish_commit, "ack_batch": _ack_batch, "ready": _ready}


def _durable(name: str) -> bool:
    """Must the call's commit be on disk before its answer goes? Publishes always; ACKs
    with ``SMQP_ACK_DURABILITY=full`` (by default they commit without a flush)."""
    from django.conf import settings

    return name in ("publish_batch", "publish_commit") or (
        name == "ack_batch" and settings.SMQP_ACK_DURABILITY == "full")


def _follow(generations: tuple[int, int], seen: list[int | None]) -> None:
    """Drop the cached topic tree / access snapshots when the listener changed them."""
    from topics import tree
    from ual import resolution

    if generations[0] != seen[0]:
        tree.invalidate_local()
    if generations[1] != seen[1]:
        resolution.invalidate_local()
    seen[:] = generations


def flush_behind(database: str) -> str | None:
    """SQLite in WAL mode with ``synchronous=FULL`` (or EXTRA): this process commits with
    NORMAL instead, which writes the WAL without waiting for the disk, and flushes the WAL
    itself (:func:`serve`) before it answers a call that must be durable. Returns the WAL
    file's path then, else None (the configured level stays).

    Why: a small batch's commit waits about 0.4 ms for the disk with FULL, and this process
    is the database's one writer. Now calls already waiting commit before the flush (an
    ACK behind a publish no longer waits for the disk), and one flush covers every commit
    before it (group commit). What is answered is as durable as with FULL: a transaction
    is on disk once its WAL frames are, and a checkpoint (which may overwrite them later)
    flushes the WAL before and the database file after."""
    from django.conf import settings
    from django.db import connection
    from django.db.backends.signals import connection_created

    if not _flushes_behind(connection):
        return None
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        if str(cursor.fetchone()[0]).lower() != "wal":  # the file system refused WAL
            return None

    def normal(sender: Any, connection: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")

    # The level rows.hot_transaction(relaxed=True) puts back after its own commit.
    settings.SMQP_SQLITE_SYNCHRONOUS = "NORMAL"
    connection_created.connect(normal, weak=False)  # a new connection after a lost one too
    normal(None, connection)
    return f"{database}-wal"


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
        if len(self._buffer) < _LENGTH.size:
            with contextlib.suppress(EOFError):  # get() says so, when it is asked next
                self._receive(wait=False)
            if len(self._buffer) < _LENGTH.size:
                return None
        return _LENGTH.unpack_from(self._buffer)[0]

    def get(self, *, wait: bool) -> bytes | None:
        """The next frame; None when ``wait`` is false and no whole frame has come yet.
        Raises EOFError when the socket closed."""
        while (frame := take_frame(self._buffer)) is None:
            if not self._receive(wait=wait):
                return None
        return frame


def serve(fd: int, database: str) -> None:
    """Answer calls on the socket ``fd`` until it closes.

    With a WAL to flush (:func:`flush_behind`), the answers of durable calls wait in
    ``owed`` while more calls are already waiting (at most :data:`FLUSH_WITHIN` seconds):
    those commit first, then one flush covers them all, and the answers go. Not a long call
    (:data:`LONG_CALL_BYTES`, a large publish batch): the answers owed are flushed and sent
    before it, so that they do not wait for its commit, and the listener sends the next
    batch meanwhile. An answer that needs no flush (a failed call, a relaxed ACK) goes at
    once, before them: the listener matches answers to calls by their numbers."""
    from django.conf import settings
    from django.db import connection

    from broker.store.dbthread import call_here

    connection.settings_dict["NAME"] = database
    if connection.vendor == "postgresql" and settings.SMQP_PG_PREPARED_STATEMENTS:
        # This connection runs the same few INSERTs over arrays again and again (rows.Table:
        # a publish batch's rows, the usage events): psycopg prepares each after five runs,
        # and PostgreSQL then neither parses nor plans it each time (its generic plan is
        # the one plan an INSERT from unnest() has). Statements that find rows stay
        # unprepared (messages._execute_all says why). Django leaves this off by default.
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.setdefault("prepare_threshold", 5)
        connection.close()  # the next use connects with it
    sock = socket.socket(fileno=fd)
    inbox = _Inbox(sock)
    wal = flush_behind(database)
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
            try:
                _follow(generations, seen)
                reply: tuple[int, bool, Any] = (call_id, True, call_here(CALLS[name], *args))
            except Exception as exc:
                logger.exception("storage call %s failed", name)
                reply = (call_id, False, exc)
            try:
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle: say what it was
                data = pickle.dumps((call_id, False, RuntimeError(repr(reply[2]))))
            data = _LENGTH.pack(len(data)) + data
            # A failed call committed nothing: its answer needs no flush.
            if wal is not None and reply[1] and _durable(name):
                if not owed:
                    owed_since = time.monotonic()
                owed.append(data)
            else:
                sock.sendall(data)
    except OSError:  # the listener is gone
        return


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


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole process group: the listener stops first and closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    import django

    django.setup()
    # What the calls run, loaded now rather than by the first call (some 0.2 s here, which
    # the first publish after a start would wait, and every publish queued behind it).
    import broker.services.messages  # noqa: F401
    from broker.heap import freeze_startup

    freeze_startup()
    serve(int(argv[0]), argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
