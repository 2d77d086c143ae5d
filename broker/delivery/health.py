"""The operators' view of one listener: its counters (:class:`broker.store.opsmetrics.Recorder`)
and its health, written to Redis every METRICS_FLUSH_SECONDS for the console and /metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING

from broker.store import opsmetrics

if TYPE_CHECKING:
    from .commit import GroupCommit
    from .dispatcher import Session

logger = logging.getLogger("broker.delivery")

# How often the operators' counters and this listener's health go to Redis (opsmetrics).
METRICS_FLUSH_SECONDS = 1.0


class HealthReport:
    """What the console shows of one dispatcher (``origin``): its ``sessions`` (shared with
    the dispatcher), its queues and storage processes (``commits``), and the counts its parts
    record in ``metrics``, flushed by a task from construction to :meth:`close`."""

    def __init__(self, origin: str, sessions: dict[int, set[Session]],
                 metrics: opsmetrics.Recorder, commits: GroupCommit) -> None:
        self.origin = origin
        self.sessions = sessions
        self.metrics = metrics
        self.commits = commits
        self._started_at = time.time()
        self._metrics_task = asyncio.ensure_future(self._metrics_loop())

    def health(self) -> dict:
        """This listener as the operators' console shows it (opsmetrics.listeners())."""
        return {"origin": self.origin, "host": socket.gethostname(), "pid": os.getpid(),
                # Which server this dispatcher serves (runsmqp, runqqp, daphne, ...).
                "command": _command(), "role": process_role(),
                "started": self._started_at, "at": time.time(),
                "sessions": sum(len(s) for s in self.sessions.values()),
                "storage_processes": self.commits.storage.health(),
                "journal_backlog": self.commits.queued[1],
                "publish_queue": self.commits.queued[0]}

    async def _metrics_loop(self) -> None:
        """Every METRICS_FLUSH_SECONDS: the counts since the last time, and this listener's
        health, to Redis (in a thread: a slow Redis never holds up the event loop)."""
        while True:
            await asyncio.sleep(METRICS_FLUSH_SECONDS)
            await self.flush()

    def unacked(self) -> dict[str, int]:
        """guid → messages sent to the session and not ACKed yet (its mailbox's one in
        flight, and the queue-mode locks it holds), for the operators' sessions list."""
        out = {}
        for sessions in self.sessions.values():
            for session in sessions:
                # (A session of a door without a login row, or a test's stand-in, has none.)
                login = getattr(session, "session", None)
                if login is not None and getattr(login, "guid", None):
                    out[login.guid] = session.mailbox.unacked
        return out

    async def flush(self) -> None:
        """The counts since the last time, this listener's health and its sessions' unACKed
        messages, to Redis."""
        deltas = self.metrics.take()
        try:
            await asyncio.to_thread(opsmetrics.flush, deltas, self.health(), self.origin,
                                    self.unacked())
        except Exception:  # Redis away: the counts wait for the next flush
            self.metrics.give_back(deltas)
            logger.warning("operators' counters not written", exc_info=True)

    def close(self) -> None:
        self._metrics_task.cancel()


#: What the console calls each broker process, by the command that started it.
ROLES = {"runsmqp": "SMQP listener", "runqqp": "QQP listener",
         "runlinks": "federation links", "daphne": "web: admin, REST, XMPP (Daphne)",
         "celery": "Celery worker"}


def _command() -> str:
    """The management command (``manage.py runsmqp``) or the module run (``python -m
    daphne``, whose argv[0] is its ``__main__.py``) of this process."""
    argv = sys.argv
    if argv and os.path.basename(argv[0]) == "__main__.py":
        return os.path.basename(os.path.dirname(argv[0]))
    if argv and os.path.basename(argv[0]) in ("manage.py", "django-admin") and len(argv) > 1:
        return argv[1]
    return os.path.basename(argv[0]) if argv else ""


def process_role() -> str:
    command = _command()
    return ROLES.get(command, command or "unknown process")
