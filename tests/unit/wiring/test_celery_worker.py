"""The Celery worker bounds how long a pool child told to stop waits for the worker to count
its last result (broker.celery): billiard's own bound, 30 s, outlasted runbroker's stop
deadline when a task ended just as the worker's warm shutdown began."""

from __future__ import annotations

import inspect
import warnings

import billiard.pool
from celery.signals import worker_init

import broker.celery  # noqa: F401  (connects the worker's signal handlers)


def test_the_worker_bounds_its_pool_childrens_wait_at_stop_to_two_seconds(monkeypatch):
    monkeypatch.setattr(billiard.pool, "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT", 300)
    with warnings.catch_warnings():  # Celery's Django fixup wants a real worker as sender
        warnings.simplefilter("ignore")
        worker_init.send(sender=None)
    limit = billiard.pool.GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT
    assert limit * billiard.pool.GUARANTEE_MESSAGE_CONSUMPTION_RETRY_INTERVAL == 2.0


def test_the_pool_child_still_reads_the_bound_it_is_given():
    """The child reads the module's constants when it stops: a billiard release that renamed
    them would leave the bound unset, silently."""
    source = inspect.getsource(billiard.pool.Worker._ensure_messages_consumed)
    assert "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT" in source
    assert "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_INTERVAL" in source
