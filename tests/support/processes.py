"""Processes the cluster tests look at: a process's children, and who holds a TCP
connection to a port (``ss``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.timing import scaled


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def connected_pids(port: int, prefix: list[str] | None = None) -> set[int]:
    """Pids with an established TCP connection to ``port`` (run through ``prefix``, e.g.
    ``ip netns exec NS``, to look inside a namespace)."""
    out = subprocess.run([*(prefix or []), "ss", "-tnpH", "state", "established",
                          "dport", f"= :{port}"], capture_output=True, text=True,
                         timeout=scaled(30)).stdout
    return {int(p) for p in re.findall(r"pid=(\d+)", out)}
