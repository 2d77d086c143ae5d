"""Celery tasks: what time decides. Each task calls one service function; the sweeps call it
batch after batch (one transaction each) until the work is done or their time is up, so a
burst of expiries is cleared in one run rather than a batch per beat."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

from broker.celery import app
from broker.services import locks, sweeps
from broker.services import topics as topic_service


def _until_done(batch: Callable[[], int], full: int | None) -> int:
    """Run ``batch`` again while it did a full batch (``full``; None: any work at all) and
    ``SMQP_SWEEP_BUDGET_SECONDS`` have not passed. Returns the total."""
    deadline = time.monotonic() + settings.SMQP_SWEEP_BUDGET_SECONDS
    total = 0
    while True:
        done = batch()
        total += done
        if (done < full if full is not None else done == 0) or time.monotonic() >= deadline:
            return total


@app.task(name="broker.finalize_topic_removals")
def finalize_topic_removals() -> int:
    """Delete topics marked by REMOVE TOPIC whose queues have emptied."""
    return topic_service.finalize_removal()


@app.task(name="broker.recover_ack_journals")
def recover_ack_journals() -> int:
    """ACK journals of listeners that are gone (and have not restarted) reach the database."""
    from broker.delivery import recover_journals

    return recover_journals()


@app.task(name="broker.expire_messages")
def expire_messages() -> int:
    """Messages whose timeout ran out go to Trash."""
    size = settings.SMQP_SWEEP_BATCH
    return _until_done(lambda: sweeps.expire_messages(limit=size), size)


@app.task(name="broker.purge_trash")
def purge_trash() -> int:
    """Trash older than SMQP_TRASH_RETENTION seconds is deleted."""
    size = settings.SMQP_SWEEP_BATCH
    return _until_done(
        lambda: sweeps.purge_trash(settings.SMQP_TRASH_RETENTION, limit=size), size)


@app.task(name="broker.expire_queue_locks")
def expire_queue_locks() -> int:
    """Queue mode: locks past their deadline end; their messages go to the next subscriber,
    or to Trash once their retries are spent."""
    return _until_done(locks.expire_locks, 1000)


@app.task(name="broker.requeue_queue_deliveries")
def requeue_queue_deliveries() -> int:
    """Queue mode: messages waiting too long for one account go to the next subscriber."""
    # A delivery moved is not stale again in this run: this ends.
    return _until_done(sweeps.requeue_stale_queue_deliveries, None)


@app.task(name="broker.end_subscriptions")
def end_subscriptions() -> int:
    """Subscriptions whose lease ran out, or whose subscribe right was revoked, end; their
    accounts are told (NOTIFY SUBSCRIPTION ... CANCELLED)."""
    from broker.services import subscriptions

    return _until_done(subscriptions.end_subscriptions, 1000)
