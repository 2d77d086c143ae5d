"""Property and fuzz example counts, sized for the run at hand.

Each test names its full count, ``@settings(max_examples=examples(300))``;
``SMQP_HYPOTHESIS_SCALE`` multiplies them all: below 1 for the inner loop (``make test-fast``
runs the unit tests at 0.5), above 1 for a soak run (20: a long night). ``make test`` runs the
counts as written. A scaled count never drops below 10 examples."""

from __future__ import annotations

import os


def _scale() -> float:
    raw = os.environ.get("SMQP_HYPOTHESIS_SCALE", "").strip()
    value = float(raw) if raw else 1.0
    if value <= 0:
        raise ValueError(f"SMQP_HYPOTHESIS_SCALE must be a positive number, not {raw!r}")
    return value


SCALE = _scale()


def examples(count: int) -> int:
    """``count`` times ``SMQP_HYPOTHESIS_SCALE`` (at least 10, or ``count`` if smaller)."""
    return max(min(count, 10), round(count * SCALE))
