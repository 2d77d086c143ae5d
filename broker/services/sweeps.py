"""What time decides (profile §8), run by the Celery sweeps (:mod:`broker.tasks`): expiry into
Trash, the Trash purge, and queue-mode retries (the next subscriber, or dead letters).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from broker.models import Delivery, Message, UsageEvent
from topics import tree as topic_tree
from topics.models import Topic

from . import notify
from .ack import mark_dead
from .deliveries import NO_PRIORITY, receivers, subscribers
from .publish import Published


def expire_messages(now: datetime | None = None, limit: int = 10_000) -> int:
    """Messages whose timeout ran out move to their topic's Trash (``limit`` at most)."""
    now = now or timezone.now()
    with transaction.atomic():
        # Oldest first, in the order of the index (SQLite then reads the index, not the table).
        ids = list(Message.objects.filter(state=Message.State.PENDING, expires__lte=now)
                   .order_by("expires", "pk").values_list("pk", flat=True)[:limit])
        Message.objects.filter(pk__in=ids).update(state=Message.State.TRASH, trashed=now)
        UsageEvent.objects.bulk_create([UsageEvent(kind=UsageEvent.Kind.EXPIRE, smuid=m)
                                        for m in ids])
    return len(ids)


def purge_trash(retention_seconds: int, now: datetime | None = None,
                limit: int = 10_000) -> int:
    """Trash older than the retention period is deleted for good (``limit`` at most)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=retention_seconds)
    with transaction.atomic():
        ids = list(Message.objects.filter(state=Message.State.TRASH, trashed__lte=cutoff)
                   .order_by("trashed", "pk").values_list("pk", flat=True)[:limit])
        Message.objects.filter(pk__in=ids).delete()
    return len(ids)


def requeue_stale_queue_deliveries(now: datetime | None = None) -> int:
    """Queue mode: a message not ACKed within its topic's retry timeout goes to the next
    subscribing account; after the topic's max retries it is dead (Trash, for audit).
    Returns how many deliveries moved or died."""
    now = now or timezone.now()
    tree = topic_tree.tree()
    queue_topics = [n for n in tree.by_id.values()
                    if n.delivery_mode == Topic.DeliveryMode.QUEUE and n.link_id is None]
    moved: list[Published] = []
    dead: list[tuple[int, int]] = []
    touched = 0
    for topic in queue_topics:
        params = tree.effective(topic)
        cutoff = now - timedelta(seconds=int(params["retry_timeout"] or 30))
        stale = list(Delivery.objects.filter(
            message__topic_id=topic.pk, message__state=Message.State.PENDING,
            state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED],
        ).filter(Q(last_attempt__lte=cutoff) | Q(last_attempt__isnull=True, created__lte=cutoff))
            .select_related("message")[:1000])
        if not stale:
            continue
        targets = receivers(subscribers([topic], now)().get(topic.pk, ()), topic, now)
        for delivery in stale:
            touched += 1
            attempts = delivery.attempts + 1
            if attempts > int(params["max_retries"] or 0) or not targets:
                dead.append((delivery.account_id, delivery.message_id))
                continue
            later = [a for a in targets if a > delivery.account_id]
            target = later[0] if later else targets[0]
            with transaction.atomic():
                Delivery.objects.filter(pk=delivery.pk).update(
                    account_id=target, attempts=attempts, last_attempt=now,
                    state=Delivery.State.PENDING)
            moved.append(Published(delivery.message_id, topic.pk, topic.path,
                                   delivery.message.priority or NO_PRIORITY, [target]))
    if dead:
        mark_dead(dead)
    if moved:
        notify.messages_committed(moved)
    return touched
