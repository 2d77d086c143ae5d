"""A door session's idle clock (broker.consumers.idle) on a loop whose time the test moves:
the close comes a period after the last activity, the notice once per idle period a notice
period before it, and before login traffic does not restart the clock. Over a socket:
e2e/smqp/test_session (the idle and login timeouts)."""

from __future__ import annotations

from broker.consumers.idle import IdleWatchdog


class Loop:
    """call_later and time, with time moved by hand (``advance`` runs what falls due)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[list] = []  # [when, callback, cancelled]

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback):
        timer = [self.now + delay, callback, False]
        self.timers.append(timer)
        return type("Handle", (), {"cancel": lambda _: timer.__setitem__(2, True)})()

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = sorted((t for t in self.timers if not t[2] and t[0] <= end),
                         key=lambda t: t[0])
            if not due:
                break
            timer = due[0]
            timer[2] = True
            self.now = timer[0]
            timer[1]()
        self.now = end


def watchdog(logged_in: bool = True):
    loop, events = Loop(), []
    dog = IdleWatchdog(loop, restarts=lambda: logged_in,
                       notice=lambda s: events.append(("notice", loop.now, s)),
                       expire=lambda: events.append(("expire", loop.now)))
    return loop, dog, events


def test_an_idle_session_is_told_then_closed():
    loop, dog, events = watchdog()
    dog.arm(100, notice=10)
    loop.advance(200)
    assert events == [("notice", 90, 10), ("expire", 100)]


def test_activity_restarts_the_clock_and_earns_a_new_notice():
    loop, dog, events = watchdog()
    dog.arm(100, notice=10)
    loop.advance(95)  # noticed at 90
    dog.touch()
    assert dog.active_since_notice  # (the notice is not written then)
    loop.advance(200)
    assert events == [("notice", 90, 10), ("notice", 185, 10), ("expire", 195)]


def test_before_login_traffic_does_not_restart_the_clock():
    loop, dog, events = watchdog(logged_in=False)
    dog.arm(30)
    loop.advance(20)
    dog.touch()
    loop.advance(20)
    assert events == [("expire", 30)]


def test_a_cancelled_clock_closes_nothing():
    loop, dog, events = watchdog()
    dog.arm(30)
    dog.cancel()
    loop.advance(100)
    assert events == []
