"""Latency samples, percentiles, result tables and JSON result files."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the values; all ``nan`` when there are none."""
    if not values:
        return math.nan, math.nan, math.nan
    return statistics.median(values), min(values), max(values)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (``nan`` when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class LatencySummary:
    """Count and latency figures (milliseconds) of one kind of operation."""

    count: int
    errors: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in self.__dict__.items()}


@dataclass
class Samples:
    """Latencies (seconds) and error counts per operation kind."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, seconds: float, ok: bool) -> None:
        self.latencies.setdefault(kind, []).append(seconds)
        if not ok:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def merge(self, other: Samples) -> None:
        for kind, values in other.latencies.items():
            self.latencies.setdefault(kind, []).extend(values)
        for kind, n in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.latencies.values())

    @property
    def total_errors(self) -> int:
        return sum(self.errors.values())

    def summary(self, kind: str | None = None) -> LatencySummary:
        """Figures for one kind, or for all kinds together (``kind=None``)."""
        if kind is None:
            values = sorted(v for vs in self.latencies.values() for v in vs)
            errors = self.total_errors
        else:
            values = sorted(self.latencies.get(kind, []))
            errors = self.errors.get(kind, 0)
        ms = [v * 1000 for v in values]
        return LatencySummary(
            count=len(ms),
            errors=errors,
            mean_ms=sum(ms) / len(ms) if ms else math.nan,
            p50_ms=percentile(ms, 50),
            p90_ms=percentile(ms, 90),
            p99_ms=percentile(ms, 99),
            max_ms=ms[-1] if ms else math.nan,
        )


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:,.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in body)) if body else len(str(h))
              for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [values[0].ljust(widths[0])]
        parts += [v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True)]
        return "  ".join(parts)

    out = [line([str(h) for h in headers]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in body]
    return "\n".join(out)


def environment_info() -> dict[str, Any]:
    """Where the figures were measured: machine, Python, git commit."""
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS_DIR.parent.parent,
            capture_output=True, text=True, timeout=10,
        ).stdout.strip() or None
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "git_commit": commit,
    }


def timestamp() -> str:
    """A file-name-safe local timestamp (``20250101-120000``)."""
    return time.strftime("%Y%m%d-%H%M%S")


def write_results(name: str, payload: dict[str, Any], *, stamp: str | None = None) -> Path:
    """Write ``payload`` to ``bench/results/<timestamp>-<name>.json``; returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{stamp or timestamp()}-{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path
