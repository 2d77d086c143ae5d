"""A storage process keeps the planner's statistics between calls
(:func:`broker.store.worker._keep_statistics`); a failure there, such as the database gone
in a failover, must not end the process: the next call meets it and answers with it."""

from __future__ import annotations

import logging

from broker.store import worker


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def keep_statistics(self) -> None:
        self.calls += 1
        raise ConnectionError("the server closed the connection")


def test_a_failure_keeping_statistics_is_logged_and_the_process_goes_on(caplog,
                                                                       django_db_blocker):
    store = Failing()
    # (The guard lets Django drop a broken connection: no query, but pytest-django blocks
    # the connection object's use outside a database test.)
    with django_db_blocker.unblock(), caplog.at_level(logging.WARNING,
                                                      logger="broker.store.worker"):
        worker._keep_statistics(store)  # type: ignore[arg-type]
        worker._keep_statistics(store)  # type: ignore[arg-type]
    assert store.calls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "keeping the planner's statistics failed"] * 2
