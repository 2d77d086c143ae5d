"""Storage processes, the listener's side: the listener's group commits, run in processes of
their own.

The listener is one Python process: its event loop (parsing, replies, NOTIFY) and its
database thread share one GIL, so together they never use more than one core, while the
machine has more. The two hot calls, the publish batch and the ACK batch, hold half of that
core: each has a *lane*, a child process (:mod:`.worker`) with a database connection of its
own, fed over a socket pair. What the processes run is given by the layer above
(:class:`StorageCalls`): the rules stay in the services; only where they run changes.

Lanes: on SQLite one for both (one writer; a second would wait for the lock in its busy
handler), on PostgreSQL two for publishes (one builds a batch while the other commits the
one before it: :meth:`Storage._publish_held`) and one for ACKs, which commit side by side.

A call carries the listener's local cache generations (topic tree, access snapshots), so a
change this process made (CREATE TOPIC, a UAL edit) is seen by the next batch at once, not a
poll interval later. A child ends when its socket closes (the listener stopped or died); a
child that ends with calls outstanding fails them with :class:`StorageLost`, whose outcome
is unknown (the batch may have committed just before), and the next call starts a new one.

A listener forks its first processes (:func:`prefork`) before it runs a thread or an event
loop: they start with Django already loaded, instead of loading it again (about half a CPU
second each). A process started again later runs its program afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import dbthread
from .backends import backend
from .frames import LENGTH, take_frame

logger = logging.getLogger("broker.store.lanes")

#: Least time between two starts of one lane's process.
RESTART_SECONDS = 1.0
#: A process that ended is started again after ``SMQP_STORAGE_RESTART_SECONDS``; one that
#: lived less than SHORT_LIFE_SECONDS, after twice the wait before, up to MAX_RESTART_SECONDS.
SHORT_LIFE_SECONDS = 10.0
MAX_RESTART_SECONDS = 30.0
#: Publish batches on their way to a storage process that flushes the WAL itself (SQLite):
#: it finds the next one queued when it has answered one, instead of idling until the
#: listener sends it (see :attr:`Storage.publish_window` for when more than two go).
PUBLISHES_IN_FLIGHT = 4
#: Publishes that make a batch worth sending while two are on their way already (SQLite).
EXTRA_BATCH_MIN = 32
#: Publishes that make a batch worth PostgreSQL's second publish lane.
SECOND_LANE_MIN = 128


@dataclass(frozen=True)
class StorageCalls:
    """What the storage processes serve, as the layer above the store defines it."""

    #: The module a storage process runs, ``python -m <entry> <socket fd> <database>``
    #: (it serves the calls ``publish_batch``, ``publish_begin``, ``publish_commit``,
    #: ``ack_batch`` and ``ready`` through :func:`.worker.main`).
    entry: str
    #: The two group commits as functions, run on the listener's database threads when
    #: there are no storage processes.
    publish_batch: Callable[[list], list]
    ack_batch: Callable[[list], list]
    #: ``restore(requests, results)``: puts back into a storage process's publish results
    #: what it did not send back (the data the listener has in the requests).
    restore: Callable[[list, list], None]


class StorageLost(Exception):
    """The storage process ended before it answered: the call may or may not have
    committed."""


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
    """One storage process (running ``entry``) and the calls waiting for it."""

    def __init__(self, name: str, database: str, entry: str | None = None) -> None:
        self.name = name
        self.database = database
        self.entry = entry
        self._transport: asyncio.Transport | None = None
        self._process: subprocess.Popen | _Forked | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._starting: asyncio.Future | None = None
        self._next_start = float("-inf")
        self._started_at = 0.0
        self._restart_wait = 0.0  # the wait before the last restart (0: none yet)
        self._restart: asyncio.TimerHandle | None = None
        self._closed = False
        self.starts = 0  # processes started (the operators' console: restarts = starts - 1)

    async def call(self, name: str, *args: Any) -> Any:
        """The call ``name(*args)`` in the storage process; raises what it raised."""
        if self._transport is None:
            await self._start()
        assert self._transport is not None
        if self._transport.is_closing():  # it ended; connection_lost() has yet to run
            raise StorageLost(f"storage process {self.name} ended")
        future = asyncio.get_running_loop().create_future()
        call_id = next(self._ids)
        data = pickle.dumps((call_id, name, args, _generations()),
                            protocol=pickle.HIGHEST_PROTOCOL)
        self._transport.writelines((LENGTH.pack(len(data)), data))
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

        if self.entry is None:
            raise RuntimeError(f"storage lane {self.name} has no program to run")
        loop = asyncio.get_running_loop()
        forked = _preforked.pop((self.entry, self.name, self.database), None)
        if forked is not None:
            self._process, ours = forked
            await self._connect(ours, "forked")
            return
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
                [sys.executable, "-m", self.entry, str(theirs.fileno()), self.database],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        await self._connect(ours, "started")

    async def _connect(self, ours: socket.socket, how: str) -> None:
        """Serve the process just started (``self._process``) on our end of its socket."""
        assert self._process is not None
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: _Reader(self), sock=ours)
        self._transport = transport  # type: ignore[assignment]
        self._started_at = loop.time()
        self.starts += 1
        logger.info("storage process %s %s (pid %d)", self.name, how, self._process.pid)

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
        loop = asyncio.get_running_loop()
        if process is not None:
            loop.run_in_executor(None, process.wait)
        if self._closed or self.entry is None:
            return
        # Started again on its own, not at the next call: until then the health port says
        # the listener is not ready, a load balancer sends it no session, and no call comes.
        from django.conf import settings

        first = settings.SMQP_STORAGE_RESTART_SECONDS
        short = loop.time() - self._started_at < SHORT_LIFE_SECONDS
        self._restart_wait = min(max(self._restart_wait * 2, first), MAX_RESTART_SECONDS) \
            if short and self._restart_wait else first
        logger.warning("storage process %s ended; starting it again in %g s", self.name,
                       self._restart_wait)
        if self._restart is not None:
            self._restart.cancel()
        self._restart = loop.call_later(self._restart_wait, self.prestart)

    def close(self) -> None:
        self._closed = True
        if self._restart is not None:
            self._restart.cancel()
        if self._transport is not None:
            self._transport.close()

    def health(self) -> dict:
        """For the operators' console: is its process up, and how busy."""
        process = self._process
        return {"name": self.name, "pid": process.pid if process else None,
                "alive": self._transport is not None and process is not None
                and process.poll() is None,
                "waiting": len(self._waiting), "starts": self.starts}


class Storage:
    """Where one listener's group commits run: its lanes, or (``SMQP_STORAGE_PROCESSES``
    off, or an in-memory database no other process can open) the database threads."""

    def __init__(self, calls: StorageCalls) -> None:
        self.calls = calls
        names = lane_names()
        self.apart = bool(names)
        database = _database()
        self._publish = Lane("publish", database, calls.entry)
        self._ack = Lane("ack", database, calls.entry) if "ack" in names else self._publish
        # PostgreSQL: a second publish lane, so that one batch's rows are built while the
        # batch before commits (see _publish_held).
        self._held = "publish-2" in names
        self._publishers = [self._publish, Lane("publish-2", database, calls.entry)] \
            if self._held else [self._publish]
        self._lanes = tuple(dict.fromkeys((*self._publishers, self._ack)))
        self._idle_publishers = list(self._publishers)
        self._opening = asyncio.Lock()
        self._last_commit: asyncio.Future[None] | None = None
        #: How many publish batches the dispatcher may have on their way at once:
        #: (at most, whatever their size, beyond that only with this many publishes or
        #: more). SQLite, where the storage process flushes the WAL itself: four, two, 32.
        #: PostgreSQL: two on its two publish lanes, the second only for a large batch (it
        #: costs a transaction and a process more: worth it while publishers keep far ahead
        #: of one lane, not for a trickle). Else one.
        if self.apart and backend().flushes_behind():
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
        """Returns once every storage process serves (it loads Django first, which a
        publish sent earlier would wait out)."""
        if self.apart:
            await asyncio.gather(*(lane.call("ready") for lane in self._lanes))

    async def publish_batch(self, requests: list) -> list:
        if not self.apart:
            return await dbthread.run(self.calls.publish_batch, requests)
        if self._held:
            results = await self._publish_held(requests)
        else:
            results = await self._publish.call("publish_batch", requests)
        self.calls.restore(requests, results)
        return results

    async def _publish_held(self, requests: list) -> list:
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

    async def ack_batch(self, acks: list) -> list:
        if not self.apart:
            return await dbthread.run_ack(self.calls.ack_batch, acks)
        return await self._ack.call("ack_batch", acks)

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()

    def health(self) -> list[dict]:
        """Each storage process's :meth:`Lane.health`; empty when the group commits run on
        the listener's own threads (``SMQP_STORAGE_PROCESSES=0``)."""
        return [lane.health() for lane in self._lanes] if self.apart else []


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _committed(previous: asyncio.Future[None] | None) -> None:
    """Returns once the batch sent before has committed or failed."""
    if previous is not None:
        await asyncio.shield(previous)


def enabled() -> bool:
    """Do group commits run in storage processes? ``SMQP_STORAGE_PROCESSES`` (on by
    default), where another process can open the database (not an in-memory one)."""
    from django.conf import settings

    return bool(settings.SMQP_STORAGE_PROCESSES) and backend().storage_processes_possible()


def _database() -> str:
    """The database this process uses, by name: a test's database is not the configured one."""
    from django.db import connection

    return str(connection.settings_dict["NAME"])


def lane_names() -> tuple[str, ...]:
    """The storage processes a listener runs, by lane (none when :func:`enabled` is off):
    SQLite one, PostgreSQL two for publishes and one for ACKs (see the module docstring)."""
    if not enabled():
        return ()
    return ("publish", "publish-2", "ack") if dbthread.acks_apart() else ("publish",)


class _Forked:
    """A storage process :func:`prefork` started: what the lane asks of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        # As Popen.poll: while a wait() on another thread holds the lock, it has not ended.
        if not self._lock.acquire(blocking=False):
            return self.returncode
        try:
            return self._reap(os.WNOHANG)
        finally:
            self._lock.release()

    def wait(self) -> int | None:
        with self._lock:
            return self._reap(0)

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped by someone else: it has ended all the same
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


#: The processes :func:`prefork` started, each with our end of its socket, until its lane
#: takes it: by (entry, lane name, database).
_preforked: dict[tuple[str, str, str], tuple[_Forked, socket.socket]] = {}


def prefork(calls: StorageCalls) -> None:
    """Fork this process's storage processes now, each serving ``calls.entry``. For a
    process that has loaded Django and runs no other thread yet (a fork copies only the
    thread that calls it: a lock another thread held would stay held in the child), with
    no database connection open (the child would share it); else the lanes start their
    processes with ``python -m`` as they do after a restart."""
    from django.db import connections

    if calls.entry is None or threading.active_count() != 1 or any(
            c.connection is not None for c in connections.all(initialized_only=True)):
        return
    database = _database()
    ends: list[socket.socket] = []
    for name in lane_names():
        ours, theirs = socket.socketpair()
        ends.append(ours)
        pid = os.fork()
        if pid == 0:
            _serve_forked(calls.entry, theirs, ends, database)
        theirs.close()
        _preforked[(calls.entry, name, database)] = (_Forked(pid), ours)


def _serve_forked(entry: str, theirs: socket.socket, ours: list[socket.socket],
                  database: str) -> None:
    """The forked child: run ``entry``'s ``main`` as ``python -m`` would, then end without
    running the listener's exit handlers."""
    code = 1
    try:
        # As the storage process does once loaded: Ctrl-C reaches the whole process group,
        # and the listener, which stops first, ends it by closing the socket.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for end in ours:  # the listener's ends: each child sees EOF when the listener ends
            end.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        fd = theirs.detach()
        # What `ps` and the operator see is the command a restart would run.
        import setproctitle

        setproctitle.setproctitle(f"{sys.executable} -m {entry} {fd} {database}")
        importlib.import_module(entry).main([str(fd), database])
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):  # nothing may take it back to the listener
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _generations() -> tuple[int, int]:
    """This process's local cache generations (see the module docstring)."""
    from topics import tree
    from ual import resolution

    return tree.local_generation(), resolution.local_epoch()
