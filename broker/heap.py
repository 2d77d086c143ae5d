"""The garbage collector in the broker's long-running processes."""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    """Collect once, then move every object start-up made (modules, Django's set-up, the
    settings: over 100,000 in the listener) out of the collector's reach for good. A full
    collection then walks only what the running process holds; it stops the process while
    it runs, so every object it need not walk is latency saved. Call it once set-up is over,
    before the process serves."""
    gc.collect()
    gc.freeze()
