"""runbroker's restarts of a child that exited (:class:`_Restarts`): again after
RESTART_DELAY, and the broker stops once one exits RESTART_BURST times within
RESTART_WINDOW seconds, as systemd's start limit fails a unit."""

from __future__ import annotations

from broker.management.commands.runbroker import (
    RESTART_BURST,
    RESTART_DELAY,
    RESTART_WINDOW,
    _Restarts,
)


def test_an_exited_child_is_started_again_after_the_delay():
    restarts = _Restarts()
    assert restarts.exited("celery-worker", 100.0)
    assert restarts.waiting("celery-worker")
    assert restarts.due(100.0 + RESTART_DELAY / 2) == []
    assert restarts.due(100.0 + RESTART_DELAY) == ["celery-worker"]
    assert not restarts.waiting("celery-worker")
    assert restarts.due(200.0) == []  # started once, not again


def test_a_child_that_keeps_exiting_stops_the_broker_and_old_exits_are_forgotten():
    restarts = _Restarts()
    now = 0.0
    for _ in range(RESTART_BURST - 1):
        assert restarts.exited("smqp", now)
        restarts.due(now + RESTART_DELAY)
        now += 1.0
    assert not restarts.exited("smqp", now)  # the RESTART_BURST-th exit within the window
    # Another child's exits count apart; exits older than the window no longer count.
    assert restarts.exited("daphne", now)
    later = _Restarts()
    for i in range(RESTART_BURST * 2):
        assert later.exited("links", i * RESTART_WINDOW / (RESTART_BURST - 1))
        later.due(i * RESTART_WINDOW)
