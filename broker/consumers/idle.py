"""The idle clock of a door's session: it closes the session after a period without activity,
and looks, a notice period before that, whether the client is to be told (SMQP's NOTIFY
SERVER TIMEOUT). Before login the clock does not restart on traffic: log in or leave.

Timers only (the session's loop); what a notice or a close writes is the door's."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable


class IdleWatchdog:
    """One session's idle clock. The door calls :meth:`touch` on each activity and
    :meth:`arm` when the period changes (at login); ``notice(seconds)`` is called once per
    idle period when the close is ``seconds`` away, ``expire()`` when it is due."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, restarts: Callable[[], bool],
                 notice: Callable[[int], None], expire: Callable[[], None]) -> None:
        self._loop = loop
        self._restarts = restarts  # False: traffic does not restart the clock (no login yet)
        self._notice_cb = notice
        self._expire = expire
        self.last_activity = loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._period = 0.0
        self._notice = 0.0
        self._noticed_activity: float | None = None

    def touch(self) -> None:
        self.last_activity = self._loop.time()

    @property
    def active_since_notice(self) -> bool:
        """Has the client been active since the last notice was decided?"""
        return self._noticed_activity != self.last_activity

    def arm(self, seconds: float, notice: float = 0.0) -> None:
        """Close after ``seconds`` without activity; ``notice`` seconds before that, look
        whether the client is to be told."""
        self.cancel()
        self._period = seconds
        self._notice = notice
        self._noticed_activity = None
        self._timer = self._loop.call_later(seconds - notice, self._fired)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fired(self) -> None:
        remaining = self.last_activity + self._period - self._loop.time()
        if not self._restarts():
            remaining = 0
        if remaining > 0:
            if remaining > self._notice:
                delay = remaining - self._notice
            else:
                delay = remaining
                if self._noticed_activity != self.last_activity:
                    # Once per idle period; the notice itself is no activity of the client's.
                    self._noticed_activity = self.last_activity
                    self._notice_cb(math.ceil(remaining))
            self._timer = self._loop.call_later(delay, self._fired)
            return
        self._expire()
