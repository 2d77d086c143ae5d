"""The operators' view of a listener (:class:`broker.delivery.health.HealthReport`), alone:
stand-in sessions and group commit, Redis replaced (no socket, no database)."""

from __future__ import annotations

import os
from types import SimpleNamespace

from broker.delivery import health
from broker.delivery.health import HealthReport
from broker.store import opsmetrics


class Commits:
    """What the report reads of the group commit."""

    queued = (5, 3)  # publishes, ACKs
    storage = SimpleNamespace(health=lambda: [{"lane": "publish", "alive": True}])


class Session:
    """A session as the report sees it: its login row (guid) and its mailbox's count."""

    def __init__(self, guid: str | None, unacked: int) -> None:
        self.session = None if guid is None else SimpleNamespace(guid=guid)
        self.mailbox = SimpleNamespace(unacked=unacked)


async def test_the_health_of_a_listener(monkeypatch):
    monkeypatch.setattr(health.sys, "argv", ["manage.py", "runsmqp", "--port", "1"])
    sessions = {42: {Session("g1", 2), Session(None, 4)}, 43: {Session("g2", 0)}}
    report = HealthReport("o1", sessions, opsmetrics.Recorder(), Commits())
    try:
        seen = report.health()
        assert {k: seen[k] for k in ("origin", "pid", "command", "role", "sessions",
                                     "storage_processes", "journal_backlog",
                                     "publish_queue")} == {
            "origin": "o1", "pid": os.getpid(), "command": "runsmqp", "role": "SMQP listener",
            "sessions": 3, "storage_processes": [{"lane": "publish", "alive": True}],
            "journal_backlog": 3, "publish_queue": 5}
        assert seen["started"] <= seen["at"]
        # A session without a login row (a door's stand-in) has no unACKed gauge.
        assert report.unacked() == {"g1": 2, "g2": 0}
    finally:
        report.close()


def test_the_role_of_a_process_by_its_command(monkeypatch):
    for argv, role in ((["/venv/lib/daphne/__main__.py", "-b", "0"], health.ROLES["daphne"]),
                       (["manage.py", "runqqp"], "QQP listener"),
                       (["manage.py", "shell"], "shell"),
                       ([], "unknown process")):
        monkeypatch.setattr(health.sys, "argv", argv)
        assert health.process_role() == role


async def test_counts_a_flush_could_not_write_wait_for_the_next(monkeypatch):
    written: list[tuple] = []

    def flush(deltas, state, origin, unacked):
        if not written:
            written.append(("failed",))
            raise ConnectionError("redis away")
        written.append((dict(deltas.totals), state["origin"], origin, unacked))

    monkeypatch.setattr(health.opsmetrics, "flush", flush)
    metrics = opsmetrics.Recorder()
    report = HealthReport("o1", {42: {Session("g1", 1)}}, metrics, Commits())
    try:
        metrics.count("publish", 2)
        await report.flush()  # Redis away: given back
        metrics.count("publish", 1)
        await report.flush()
        assert written[1:] == [({"publish_messages": 3}, "o1", "o1", {"g1": 1})]
    finally:
        report.close()
