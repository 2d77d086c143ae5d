"""Celery tasks: what time decides. Each task calls one service function."""

from __future__ import annotations

from celery import shared_task

from broker.services import topics as topic_service


@shared_task(name="broker.finalize_topic_removals")
def finalize_topic_removals() -> int:
    """Delete topics marked by REMOVE TOPIC whose queues have emptied."""
    return topic_service.finalize_removal()
