"""When a publish batch goes: at once, or after a few milliseconds for more publishes to join
it (``SMQP_PUBLISH_LINGER_MS``). Pure: no I/O, no clock of its own; the dispatcher tells it
of every publish and asks before it sends a batch.
"""

from __future__ import annotations

import math

# A publish batch smaller than LINGER_BATCH waits for company (SMQP_PUBLISH_LINGER_MS at
# most) only while publishes arrive faster than LINGER_RATE a second, measured over
# LINGER_WINDOW seconds: then a few milliseconds gather a batch worth its transaction. Below
# that rate they would gather a handful, and the wait would be latency for nothing; a
# publish after a quiet spell goes at once. Nor does a batch wait once no publish has come
# for LINGER_GAPS times the stream's mean interval (LINGER_GAP_MIN at least): publishers
# that each wait for their reply before the next PUB have all sent theirs by then, and
# more waiting would gather nothing. What was measured: bench/results/history.md.
LINGER_BATCH = 32
LINGER_RATE = 2000.0
LINGER_WINDOW = 0.25
LINGER_GAPS = 2.0
LINGER_GAP_MIN = 0.0015


class PublishLinger:
    """When the next publish batch goes: at once, or after waiting for more publishes to
    join it (see LINGER_BATCH). No I/O: the dispatcher tells it of every publish
    (:meth:`arrived`) and asks before sending a batch (:meth:`hold`)."""

    def __init__(self, seconds: float, batch: int = LINGER_BATCH, rate: float = LINGER_RATE,
                 window: float = LINGER_WINDOW, gaps: float = LINGER_GAPS,
                 gap_min: float = LINGER_GAP_MIN) -> None:
        self.seconds = seconds
        self.batch = batch
        self.rate = rate
        self.window = window
        self.gaps = gaps
        self.gap_min = gap_min
        self._since = -math.inf  # start of the current measuring window
        self._count = 0  # publishes in it
        self._measured = 0.0  # publishes a second over the last whole window
        self._last = -math.inf  # the latest publish

    def arrived(self, now: float) -> None:
        elapsed = now - self._since
        if elapsed >= self.window:
            # A whole window (or a quiet spell, which brings the rate down with it) is over.
            self._measured = self._count / elapsed
            self._since, self._count = now, 0
        self._count += 1
        self._last = now

    def hold(self, queued: int, oldest: float, now: float) -> float:
        """Seconds the ``queued`` publishes (the first of them queued at ``oldest``) should
        still wait before they go as a batch; 0: now."""
        if (not self.seconds or queued >= self.batch or self._measured < self.rate
                or now - self._since > 2 * self.window):  # the stream has stopped
            return 0.0
        gap = max(self.gap_min, self.gaps / self._measured if self._measured else 0.0)
        return max(0.0, min(oldest + self.seconds, self._last + gap) - now)
