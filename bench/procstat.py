"""CPU accounting from Linux ``/proc``: per process, per group of processes, whole machine.

The benchmarks sample these at the start and the end of a measured window and report the
difference as a percentage of one core (so 200 % is both cores of a 2-core machine).
Everything here is best effort: a process that is gone, or a ``/proc`` that is not there,
yields ``None`` or is skipped, never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process (all its threads), or None."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None


def _comm(pid: str) -> str:
    try:
        return (PROC / pid / "comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: str) -> str:
    try:
        return (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


def find_pids(*, comm: str | None = None, cmdline_contains: str | None = None) -> list[int]:
    """Processes whose name (``/proc/PID/comm``) equals ``comm`` and/or whose command line
    contains ``cmdline_contains``."""
    pids = []
    try:
        entries = [p.name for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for pid in entries:
        if comm is not None and _comm(pid) != comm:
            continue
        if cmdline_contains is not None and cmdline_contains not in _cmdline(pid):
            continue
        pids.append(int(pid))
    return pids


def machine_cpu() -> tuple[float, float] | None:
    """(busy seconds, total seconds) over all cores since boot, from ``/proc/stat``."""
    try:
        line = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [int(v) for v in line[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return (total - idle) / TICKS, total / TICKS


PidSource = Callable[[], Iterable[int]]


@dataclass
class CpuProbe:
    """Named groups of processes whose CPU time is sampled together.

    ``groups`` maps a label (``server``, ``postgres``, ``redis``, ``rabbitmq`` ...) to a
    function that lists the group's pids at sampling time (so processes that appear during
    the run are found at the end; those that exit before it are lost).
    """

    groups: dict[str, PidSource] = field(default_factory=dict)
    _start: dict[str, dict[int, float]] = field(default_factory=dict)
    _machine: tuple[float, float] | None = None

    def sample(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for label, source in self.groups.items():
            per_pid = {}
            for pid in source():
                seconds = process_cpu_seconds(pid)
                if seconds is not None:
                    per_pid[pid] = seconds
            out[label] = per_pid
        return out

    def start(self) -> None:
        """Mark the start of the measured window."""
        self._start = self.sample()
        self._machine = machine_cpu()

    def stop(self, elapsed: float) -> dict[str, float | None]:
        """CPU percent of one core per group over the window, plus ``machine`` (all cores)."""
        end = self.sample()
        result: dict[str, float | None] = {}
        for label, per_pid in end.items():
            if not per_pid:
                result[label] = None
                continue
            before = self._start.get(label, {})
            used = sum(sec - before.get(pid, 0.0) for pid, sec in per_pid.items())
            result[label] = 100 * used / elapsed if elapsed > 0 else None
        machine_end = machine_cpu()
        if self._machine is not None and machine_end is not None and elapsed > 0:
            busy = machine_end[0] - self._machine[0]
            result["machine"] = 100 * busy / elapsed
        else:
            result["machine"] = None
        return result


def redis_pids() -> list[int]:
    return find_pids(comm="redis-server")


def rabbitmq_pids() -> list[int]:
    """The RabbitMQ node: the ``beam.smp`` process(es) (their threads are the schedulers)."""
    return find_pids(comm="beam.smp")


def postgres_backend_pids(database: str) -> Callable[[], list[int]]:
    """A pid source: the PostgreSQL backends connected to ``database`` (their process title
    names the database), plus the WAL writer, which does the commits' disk writes."""

    def source() -> list[int]:
        pids = []
        for pid in find_pids(comm="postgres"):
            cmdline = _cmdline(str(pid))
            if f" {database} " in cmdline or "walwriter" in cmdline:
                pids.append(pid)
        return pids

    return source
