"""The listeners' counters (broker/store/opsmetrics.py): what a Recorder gathers, how a
flush adds it up in Redis, and that counts survive a flush that fails."""

from __future__ import annotations

import uuid

import pytest
import redis
from django.test import override_settings

from broker.store import opsmetrics


@pytest.fixture
def prefix():
    from django.conf import settings

    caches = {"default": {**settings.CACHES["default"],
                          "KEY_PREFIX": f"ops-unit-{uuid.uuid4().hex[:8]}"}}
    with override_settings(CACHES=caches):
        yield
        client = opsmetrics.client()
        keys = list(client.scan_iter(match=opsmetrics.key("*")))
        if keys:
            client.delete(*keys)


def test_flush_adds_up_counts_buckets_and_health(prefix):
    minute = 29_000_000
    r = opsmetrics.Recorder()
    r.count("publish", 3, now=minute * 60 + 5)
    r.count("publish", 2, now=minute * 60 + 65)  # the next minute
    r.count("deliver", now=minute * 60 + 5)
    r.count("ack", 0)  # nothing
    r.commit("publish", 3, 0.004)
    r.commit("publish", 700, 0.3)
    opsmetrics.flush(r.take(), {"origin": "x", "pid": 1}, "x")
    r.count("publish", 1, now=minute * 60 + 5)
    opsmetrics.flush(r.take())

    totals = opsmetrics.totals()
    assert totals["publish_messages"] == 6 and totals["deliver_messages"] == 1
    assert "ack_messages" not in totals
    assert totals["publish_commits"] == 2 and totals["publish_commit_size_sum"] == 703
    assert totals["publish_commit_seconds_sum"] == pytest.approx(0.304)
    assert totals["publish_commit_size_le_5.0"] == 1
    assert totals["publish_commit_size_le_1000.0"] == 1
    assert totals["publish_commit_seconds_le_0.005"] == 1
    assert totals["publish_commit_seconds_le_0.5"] == 1
    series = opsmetrics.series("m", minute, 3)
    assert series == {"publish": [4, 2, 0], "deliver": [1, 0, 0], "ack": [0, 0, 0]}
    assert opsmetrics.series("h", minute // 60, 1)["publish"] == [6]
    assert opsmetrics.listeners() == [{"origin": "x", "pid": 1}]


def test_counts_survive_a_failed_flush(prefix, monkeypatch):
    r = opsmetrics.Recorder()
    r.count("ack", 2)
    taken = r.take()

    class Down:
        def pipeline(self, **kwargs):
            raise redis.ConnectionError("refused")

    monkeypatch.setattr(opsmetrics, "client", lambda: Down())
    with pytest.raises(redis.ConnectionError):
        opsmetrics.flush(taken)
    r.give_back(taken)
    r.count("ack", 1)
    monkeypatch.undo()
    opsmetrics.flush(r.take())
    assert opsmetrics.totals()["ack_messages"] == 3


def test_stats_buckets_are_cumulative(prefix):
    from broker.services import stats

    r = opsmetrics.Recorder()
    for size in (1, 1, 4, 60):
        r.commit("ack", size, 0.001)
    opsmetrics.flush(r.take())
    ack = stats.group_commits()["ack"]
    assert ack["count"] == 4 and ack["size_sum"] == 66 and ack["mean_size"] == 16.5
    assert ack["size_buckets"]["1.0"] == 2 and ack["size_buckets"]["5.0"] == 3
    assert ack["size_buckets"]["50.0"] == 3 and ack["size_buckets"]["100.0"] == 4
    assert ack["size_buckets"]["+Inf"] == 4


def test_session_counters_and_rates(prefix):
    """Issue 36: per-session messages in and out, the unacked gauge, and the rates over
    the last minute (the finished minute weighted by how much of it is still within 60 s)."""
    minute = 29_000_100
    r = opsmetrics.Recorder()
    r.session("bob0001", "out", 30, now=minute * 60 + 10)   # the finished minute
    r.session("bob0001", "out", 6, now=(minute + 1) * 60 + 1)  # the current one
    r.session("alice0002", "in", 4, now=(minute + 1) * 60 + 2)
    r.session(None, "in", 5)  # no session (a REST publish): not counted
    r.session("bob0001", "in", 0)
    opsmetrics.flush(r.take(), unacked={"bob0001": 1})
    got = opsmetrics.sessions(["bob0001", "alice0002", "gone0003"],
                              now=(minute + 1) * 60 + 30)  # half of the current minute
    assert got["bob0001"] == {"in": 0, "out": 36, "unacked": 1, "rate_in": 0.0,
                              "rate_out": round((6 + 30 * 0.5) / 60, 3)}
    assert got["alice0002"]["in"] == 4 and got["alice0002"]["rate_in"] == round(4 / 60, 3)
    assert got["gone0003"] == {"in": 0, "out": 0, "unacked": 0, "rate_in": 0.0,
                               "rate_out": 0.0}
    assert opsmetrics.sessions([]) == {}
