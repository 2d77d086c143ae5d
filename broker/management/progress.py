"""Progress of a long operator command, on stderr: on a terminal one line rewritten in place
(``granting: 1200/5000 (24%)``), elsewhere (a log, a pipe) one line per tenth of the work, so
logs stay short. Standard library only: any management command may use it."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self._shown_step = -1
        self._last_draw = 0.0
        self._started = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.1 or self.done == self.total:
                self._last_draw = now
                self.stream.write(f"\r{self._text()}")
                self.stream.flush()
            return
        step = self.done * 10 // self.total
        if step != self._shown_step:
            self._shown_step = step
            self.stream.write(self._text() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self.tty:
            elapsed = time.monotonic() - self._started
            self.stream.write(f"\r{self._text()} in {elapsed:.1f} s\n")
            self.stream.flush()

    def _text(self) -> str:
        return f"{self.label}: {self.done}/{self.total} ({self.done * 100 // self.total}%)"
