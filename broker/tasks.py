"""Celery tasks: what time decides. Each task calls one service function."""

from __future__ import annotations

from celery import shared_task

from broker.services import topics as topic_service


@shared_task(name="broker.finalize_topic_removals")
def finalize_topic_removals() -> int:
    """Delete topics marked by REMOVE TOPIC whose queues have emptied."""
    return topic_service.finalize_removal()


@shared_task(name="broker.expire_messages")
def expire_messages() -> int:
    """Messages whose timeout ran out go to Trash."""
    from broker.services import messages as message_service

    return message_service.expire_messages()


@shared_task(name="broker.purge_trash")
def purge_trash() -> int:
    """Trash older than SMQP_TRASH_RETENTION seconds is deleted."""
    from django.conf import settings

    from broker.services import messages as message_service

    return message_service.purge_trash(settings.SMQP_TRASH_RETENTION)


@shared_task(name="broker.requeue_queue_deliveries")
def requeue_queue_deliveries() -> int:
    """Queue mode: move messages not ACKed in time to the next subscriber, or to Trash."""
    from broker.services import messages as message_service

    return message_service.requeue_stale_queue_deliveries()
