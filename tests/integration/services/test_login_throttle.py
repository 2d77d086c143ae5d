"""The login throttle's counts in the real shared cache (Redis), as every door's login uses
them (:mod:`broker.services.auth`): the refusal counts every attempt no good login has
cleared, the delay only the failures already decided. So a burst of good logins of one
account (workers reconnecting at once) is admitted without delays, while guesses, parallel
or one after another, are bounded and slowed down as before."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from broker.services import auth
from broker.store import dbthread
from tests.support.timing import scaled

pytestmark = pytest.mark.django_db

PEER = "192.0.2.7"


@pytest.fixture
def limits(settings):
    settings.SMQP_LOGIN_FAILURES_BEFORE_DELAY = 3
    settings.SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT = 10
    settings.SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT = 100
    return settings


@pytest.fixture
def name() -> str:
    # Workers share the cache: each test counts under an account name of its own.
    return f"worker-{uuid.uuid4().hex[:10]}"


def test_attempts_still_being_checked_are_not_delayed(limits, name):
    first = [auth.count_attempt(PEER, name) for _ in range(10)]
    assert first == [auth.Throttle(refused=False, delay=0.0)] * 10
    # The limit still holds while they are checked: the eleventh waits for their outcome.
    assert auth.count_attempt(PEER, name) == auth.Throttle(refused=True, delay=0.0, busy=True)
    for _ in range(10):
        auth.record_success(PEER, name)
    assert auth.count_attempt(PEER, name) == auth.Throttle(refused=False, delay=0.0)


def test_decided_failures_delay_the_next_attempt(limits, name):
    delays = []
    for _ in range(6):
        throttle = auth.count_attempt(PEER, name)
        assert not throttle.refused
        delays.append(throttle.delay)
        auth.record_failure(PEER, name)
    assert delays == [0.0, 0.0, 0.0, 0.5, 1.0, 2.0]


def test_attempts_whose_check_failed_are_given_back(limits, name):
    """Clients reconnecting through a database outage: their checks raise, and their
    attempts, given back, neither delay nor refuse the logins once the database is back."""
    for _ in range(30):
        assert not auth.count_attempt(PEER, name).refused
        auth.record_undecided(PEER, name)
    assert auth.count_attempt(PEER, name) == auth.Throttle(refused=False, delay=0.0)
    auth.record_failure(PEER, name)  # a real failure still counts
    assert asyncio.run(_give_back_then_count(name)) == auth.Throttle(refused=False, delay=0.0)
    for _ in range(3):
        auth.count_attempt(PEER, name)
        auth.record_failure(PEER, name)
    # Four decided failures before it, and none of the given-back ones: as the fifth attempt
    # of test_decided_failures_delay_the_next_attempt.
    assert auth.count_attempt(PEER, name).delay == 1.0


async def _give_back_then_count(name: str) -> auth.Throttle:
    throttle = auth.count_attempt(PEER, name)
    await auth.give_back_attempt(PEER, name)
    return throttle


def test_parallel_guesses_are_bounded_and_then_refused(limits, name):
    admitted = [auth.count_attempt(PEER, name) for _ in range(10)]
    assert all(not t.refused for t in admitted)
    for _ in range(10):
        auth.record_failure(PEER, name)
    # Ten failures decided, none in flight: refused outright, not asked to wait.
    assert auth.count_attempt(PEER, name) == auth.Throttle(refused=True, delay=0.0)
    # Still refused once the burst is over, whatever the password (it is not checked).
    assert auth.count_attempt(PEER, name).refused


def test_a_burst_past_the_limit_waits_for_the_attempts_in_flight(limits, name):
    for _ in range(10):
        auth.count_attempt(PEER, name)
    waiting = [auth.count_attempt(PEER, name) for _ in range(5)]
    assert all(t.busy for t in waiting)
    # A waiting attempt gave its count back: one good login clears the pair and the account,
    # and the next attempt is admitted at once.
    auth.record_success(PEER, name)
    assert auth.count_attempt(PEER, name) == auth.Throttle(refused=False, delay=0.0)


def test_failures_from_many_addresses_reach_the_account_limit(limits, name):
    limits.SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT = 25
    for i in range(25):
        assert not auth.count_attempt(f"198.51.100.{i}", name).refused
        auth.record_failure(f"198.51.100.{i}", name)
    assert auth.count_attempt("198.51.100.200", name).refused


def test_token_guesses_are_counted_per_address(limits):
    peer = f"203.0.113.{uuid.uuid4().int % 250}"
    auth.record_success(peer, auth.TOKEN_GUESSES)  # this address's count from an earlier run
    for _ in range(3):
        auth.record_token_failure(peer, "smqp_xx")
    assert auth.token_throttle(peer).delay == 0.5


def test_an_attempt_is_counted_while_the_database_thread_is_busy(limits, name):
    # The counts are Redis work: admitting an attempt (and each poll of one waiting for its
    # pair's outcome) must not queue behind the listener's database thread, which every
    # other account's commands use.
    released = threading.Event()

    async def admit_beside_a_busy_database_thread() -> auth.Throttle:
        busy = asyncio.ensure_future(dbthread.run(released.wait, scaled(30)))
        try:
            return await asyncio.wait_for(auth.admit_attempt(PEER, name), scaled(10))
        finally:
            released.set()
            await busy

    assert asyncio.run(admit_beside_a_busy_database_thread()) == auth.Throttle(
        refused=False, delay=0.0)
