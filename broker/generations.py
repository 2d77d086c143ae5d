"""Generation counters in the shared cache (Redis): how per-process caches learn that
another process changed what they hold (the topic tree, the UAL snapshots).

A writer bumps the counter after its transaction commits; readers poll it and reload when it
moved. A counter that is missing (first use, or the cache lost it) starts from a number no
process can have seen before (the clock in microseconds), so a reset never looks like
"nothing changed". Both functions raise when the cache is unreachable; each caller decides
what that means for its own cache.
"""

from __future__ import annotations

import time

from django.core.cache import cache


def _fresh_start() -> int:
    return time.time_ns() // 1000


def read(key: str) -> int:
    value = cache.get(key)
    if value is None:
        cache.add(key, _fresh_start(), timeout=None)
        value = cache.get(key)
    return int(value)


def bump(key: str) -> None:
    try:
        cache.incr(key)
    except ValueError:  # missing: create it, or someone else just did
        if not cache.add(key, _fresh_start(), timeout=None):
            cache.incr(key)
