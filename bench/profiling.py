"""Sample a running server with py-spy and summarise where its time goes.

:class:`PySpy` runs ``py-spy record --format raw`` (collapsed stacks: one line per distinct
stack, ``frame;frame;...;leaf COUNT``) against a pid for a fixed duration.
:func:`summarize_collapsed` turns such a file into the hottest functions by *self* samples
(the function was the leaf: it was running itself) and by *inclusive* samples (it was on the
stack), as percentages of all non-idle samples, plus the share of each thread.

Run by hand on a kept file::

    python -m bench.profiling bench/results/<stamp>-profile-sqlite-publish.txt
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

FRAME_LINE = re.compile(r"\s*\((.*?):\d+\)$")
#: Where the project's own code lives (the ``project`` ranking keeps only these frames).
PROJECT_PREFIXES = ("broker/", "ual/", "topics/", "accounts/")
THREAD_FRAME = re.compile(r"^(thread|process) \(")


def py_spy_executable() -> str | None:
    """``py-spy`` next to this interpreter (the venv), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


class PySpy:
    """One ``py-spy record`` run against ``pid`` (started with :meth:`start`)."""

    def __init__(self, pid: int, output: Path, duration: float, *, rate: int = 100) -> None:
        self.pid = pid
        self.output = output
        self.duration = max(1, round(duration))
        self.rate = rate
        self.proc: subprocess.Popen[str] | None = None
        self.error: str | None = None

    def start(self) -> bool:
        exe = py_spy_executable()
        if exe is None:
            self.error = "py-spy is not installed (pip install py-spy into the venv)"
            return False
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(self.pid), "--duration", str(self.duration),
             "--rate", str(self.rate), "--format", "raw", "--threads", "--full-filenames",
             "-o", str(self.output)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        return True

    def wait(self, timeout: float = 60) -> bool:
        """Wait for py-spy to finish; False (and :attr:`error`) when it failed."""
        if self.proc is None:
            return False
        try:
            out, _ = self.proc.communicate(timeout=self.duration + timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            self.error = f"py-spy did not finish: {out[-2000:]}"
            return False
        if self.proc.returncode != 0 or not self.output.exists():
            self.error = f"py-spy exited {self.proc.returncode}: {out[-2000:]}"
            return False
        return True


def _function(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)``: lines of one function merge."""
    match = FRAME_LINE.search(frame)
    if match is None:
        return frame.strip()
    name = frame[:match.start()].strip()
    path = match[1]
    for marker in ("/site-packages/", "/lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


def summarize_collapsed(path: Path, *, top: int = 20) -> dict[str, Any]:
    """Self and inclusive hot spots of a ``py-spy --format raw`` file."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if frames and THREAD_FRAME.match(frames[0]):
            threads[frames[0]] += count
            frames = frames[1:]
        if not frames:
            continue
        total += count
        functions = [_function(f) for f in frames]
        self_counts[functions[-1]] += count
        for name in set(functions):
            inclusive[name] += count

    def ranked(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": name, "samples": n, "percent": 100 * n / total if total else 0.0}
                for name, n in counter.most_common(top)]

    project = Counter({name: n for name, n in inclusive.items()
                       if name.rsplit("(", 1)[-1].startswith(PROJECT_PREFIXES)})
    return {
        "file": str(path),
        "samples": total,
        "threads": ranked(threads),
        "top_self": ranked(self_counts),
        "top_inclusive": ranked(inclusive),
        "top_project_inclusive": ranked(project),
    }


def format_summary(summary: dict[str, Any], *, top: int = 15) -> str:
    """A readable rendering of :func:`summarize_collapsed`."""
    lines = [f"py-spy: {summary['samples']:,} non-idle samples ({summary['file']})"]
    if summary["threads"]:
        lines.append("  by thread:")
        lines += [f"    {t['percent']:5.1f}%  {t['function']}" for t in summary["threads"][:6]]
    lines.append("  hottest by self time (the function itself was running):")
    lines += [f"    {t['percent']:5.1f}%  {t['function']}" for t in summary["top_self"][:top]]
    lines.append("  hottest by inclusive time (on the stack):")
    lines += [f"    {t['percent']:5.1f}%  {t['function']}"
              for t in summary["top_inclusive"][:top]]
    lines.append("  the project's own functions by inclusive time:")
    lines += [f"    {t['percent']:5.1f}%  {t['function']}"
              for t in summary.get("top_project_inclusive", [])[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiling",
                                     description="Summarise a py-spy --format raw file.")
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    print(format_summary(summarize_collapsed(args.file, top=args.top), top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
