"""The ACK journal: a subscriber's ``310 ACK`` is recorded in an append-only file of the
listener's, and the database follows behind it in batches.

Why: a subscriber gets its next NOTIFY only after the server's ``310 ACK`` (profile §6), so
the time to record an ACK is paid once per delivered message, serially. A database commit
through the storage process is a round trip between processes and a transaction; a
``write()`` to a file the listener holds open is a few microseconds. The record is as
durable as the relaxed ACK commit it replaces: both are in the kernel's page cache when
``310 ACK`` leaves, so a killed listener or storage process loses neither, and a power loss
may deliver the message once more (``SMQP_ACK_DURABILITY=full`` flushes the journal first,
as it flushed the commit). This is how KahaDB and other broker stores keep acknowledgements.

Files: each listener process appends to a segment of its own in :func:`directory` (one per
database), ``<random>.acks``, holding an exclusive ``flock`` on it while it lives. A record is
fixed-size (:data:`RECORD`). Once the dispatcher has applied every record of a segment to the
database, the segment is deleted; a segment grows to :data:`SEGMENT_BYTES` before the next one
is started. A segment whose lock can be taken belongs to no live listener: :func:`recover`
applies it (the ACK upsert is idempotent) and deletes it. The listener does so before it
serves, and Celery beat every ``SMQP_JOURNAL_SWEEP_SECONDS`` for listeners that do not come
back. A segment is created under a temporary name and renamed once locked, so a recovery
never takes a new, empty segment for an orphan.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("broker.store.journal")

#: account id, smuid, delivery attempts, flags (little-endian, 21 bytes). Flags: bit 0 "may
#: want a receipt", the bits above it the door that took the ACK (its index in DOORS, for
#: the usage reports; 0, SMQP, in records written before doors were recorded).
RECORD = struct.Struct("<qqiB")
DOORS = ("smqp", "xmpp", "rest")
#: (account id, smuid, attempts, may want a receipt, door)
Record = tuple[int, int, int, bool, str]
SUFFIX = ".acks"
#: A segment this large is closed and the next one started (about 200,000 ACKs).
SEGMENT_BYTES = 4 * 1024 * 1024
#: Records applied in one transaction during a recovery.
RECOVERY_BATCH = 2000


def directory(settings_dict: dict[str, Any] | None = None) -> Path:
    """The journal folder of a database (``SMQP_VAR_DIR/ack-journal/<key>``): a listener
    recovers only segments written against the database it serves."""
    from django.conf import settings
    from django.db import connection

    db = settings_dict or connection.settings_dict
    name = "|".join(str(db.get(k) or "") for k in ("ENGINE", "HOST", "PORT", "NAME"))
    key = hashlib.sha256(name.encode()).hexdigest()[:16]
    return Path(settings.VAR_DIR) / "ack-journal" / key


def pack(records: Iterable[Record]) -> bytes:
    return b"".join(RECORD.pack(a, s, n, int(r) | DOORS.index(d) << 1)
                    for a, s, n, r, d in records)


def unpack(data: bytes) -> list[Record]:
    """The whole records of ``data``; a torn last one (the writer died mid-write) is
    dropped: its ``310 ACK`` was never sent."""
    whole = len(data) - len(data) % RECORD.size
    return [(a, s, n, bool(f & 1), DOORS[f >> 1] if f >> 1 < len(DOORS) else DOORS[0])
            for a, s, n, f in RECORD.iter_unpack(data[:whole])]


class _Segment:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.size = 0
        self.end = 0  # records written up to and including this segment (journal count)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)  # releases the lock, after the unlink


def _create(folder: Path) -> _Segment:
    folder.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    temporary = folder / f".{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = folder / f"{name}{SUFFIX}"
        os.rename(temporary, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return _Segment(path, fd)


class AckJournal:
    """This listener's journal: :meth:`append` before ``310 ACK``, :meth:`applied` once the
    database has those records (in the order appended)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.written = 0
        self.done = 0
        self._closed: deque[_Segment] = deque()  # full segments with records not yet applied
        self._current = _create(folder)

    def append(self, records: list[Record]) -> None:
        """Write records (raises OSError, e.g. a full disk: then none of them counts as
        recorded, and the segment is cut back to its last whole record, so that the records
        appended after them stay aligned)."""
        data = pack(records)
        segment = self._current
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(segment.fd, view):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.size)
            raise
        segment.size += len(data)
        self.written += len(records)
        segment.end = self.written
        if segment.size >= SEGMENT_BYTES:
            self._closed.append(segment)
            self._current = _create(self.folder)
            self._current.end = self.written

    def flusher(self) -> Callable[[], None]:
        """A function that fdatasyncs what was appended until now (``SMQP_ACK_DURABILITY=
        full``), safe to run on another thread: it holds its own descriptors, so a segment
        deleted meanwhile does not matter."""
        fds = [os.dup(segment.fd) for segment in (*self._closed, self._current)]

        def flush() -> None:
            try:
                for fd in fds:
                    os.fdatasync(fd)
            finally:
                for fd in fds:
                    os.close(fd)

        return flush

    def applied(self, count: int) -> None:
        """The next ``count`` records are in the database: segments holding nothing else
        are deleted; a current segment with everything applied starts over, empty."""
        self.done += count
        while self._closed and self._closed[0].end <= self.done:
            self._closed.popleft().remove()
        current = self._current
        if self.done == self.written and current.size >= SEGMENT_BYTES // 4:
            os.ftruncate(current.fd, 0)
            current.size = 0

    @property
    def pending(self) -> int:
        return self.written - self.done

    def close(self) -> None:
        """Stop writing. Segments are deleted when everything was applied, else kept for
        :func:`recover` (this process's lock goes with it)."""
        segments = [*self._closed, self._current]
        self._closed.clear()
        for segment in segments:
            if self.pending == 0:
                segment.remove()
            else:
                os.close(segment.fd)


def _orphans(folder: Path) -> Iterator[tuple[Path, int]]:
    """(path, locked fd) of each segment no live process holds."""
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):
        if not (path.name.endswith(SUFFIX) or path.name.endswith(".tmp")):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # recovered meanwhile by someone else
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live listener's
            os.close(fd)
            continue
        yield path, fd


def recover(folder: Path,
            apply: Callable[[list[Record]], Any]) -> int:
    """Apply the segments of listeners that are gone (``apply`` commits a list of records),
    then delete them. Returns how many records were applied. A segment whose ``apply``
    fails is kept for the next try."""
    total = 0
    for path, fd in _orphans(folder):
        try:
            with os.fdopen(os.dup(fd), "rb") as file:
                records = unpack(file.read())
            for start in range(0, len(records), RECOVERY_BATCH):
                apply(records[start:start + RECOVERY_BATCH])
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total += len(records)
            if records:
                logger.info("recovered %d ACK(s) from %s", len(records), path.name)
        except Exception:
            logger.exception("recovering the ACK journal %s failed; kept for later", path)
        finally:
            os.close(fd)
    return total
