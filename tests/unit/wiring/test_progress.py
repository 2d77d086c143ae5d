"""The operator commands' progress line (broker.management.progress): rewritten in place on a
terminal (at most every 0.1 s, and always at the end, with the time taken), one line per
tenth of the work elsewhere."""

from __future__ import annotations

import io

from broker.management import progress as module
from broker.management.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth():
    out = io.StringIO()
    p = Progress(20, "granting", out)
    for _ in range(20):
        p.advance()
    p.finish()
    assert out.getvalue().splitlines() == [
        f"granting: {done}/20 ({done * 5}%)" for done in (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20)]


def test_a_terminal_gets_one_line_rewritten_at_most_every_tenth_of_a_second(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    out = Terminal()
    p = Progress(1000, "granting", out)
    for _ in range(999):
        p.advance()  # the clock stands still: only the first draw
    assert out.getvalue() == "\rgranting: 1/1000 (0%)"
    clock[0] += 0.1
    p.advance(5)  # past the end: capped at the total, and the end is always drawn
    clock[0] += 2.5
    p.finish()
    assert out.getvalue().split("\r")[1:] == [
        "granting: 1/1000 (0%)", "granting: 1000/1000 (100%)",
        "granting: 1000/1000 (100%) in 2.6 s\n"]


def test_nothing_is_written_when_disabled_or_empty():
    for p in (Progress(10, "x", Terminal(), enabled=False), Progress(0, "x", Terminal())):
        p.advance()
        p.finish()
        assert p.stream.getvalue() == ""
