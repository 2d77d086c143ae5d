"""What time decides (profile §8), run by the Celery sweeps (:mod:`broker.tasks`): expiry into
Trash, the Trash purge, and queue-mode deliveries waiting too long for one account (the ends
of queue-mode locks are :func:`.locks.expire_locks`).
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
from .ack import finish_messages
from .deliveries import (
    NO_PRIORITY,
    has_selectors,
    next_queue_consumer,
    receivers,
    stored_view,
    subscribers,
)
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


def requeue_stale_queue_deliveries(now: datetime | None = None, limit: int = 1000) -> int:
    """Queue mode: a message waiting, unlocked, for an account that has not taken it within
    its topic's retry timeout (counted from when it was assigned: its delivery's creation, or
    its last move) goes to the next subscribing account, so that it does not wait for an
    account with no live session. Not while the account is consuming the topic (it took a
    lock on one of its messages within the retry timeout): it is getting to them, in order,
    and moving its backlog would only bounce it between accounts that are all busy, each
    of whose sessions would then spend a round trip on every message it may no longer
    lock. No attempt is counted (nothing was sent), and a locked delivery is never touched
    (its lock ends through :mod:`.locks`). This cannot deliver a message twice: a session
    that still has it waiting can no longer lock it. Nobody subscribing any more: the
    message waits unassigned, and its timeout starts. Returns how many deliveries moved or
    were given up (``limit`` at most per topic)."""
    now = now or timezone.now()
    tree = topic_tree.tree()
    queue_topics = [n for n in tree.by_id.values()
                    if n.delivery_mode == Topic.DeliveryMode.QUEUE and n.link_id is None]
    moved: list[Published] = []
    withdrawn: list[tuple[int, int]] = []
    unassigned: list[int] = []
    released = 0
    for topic in queue_topics:
        params = tree.effective(topic)
        retry = timedelta(seconds=int(params["retry_timeout"] or 30))
        turn_ended = Q(next_attempt__lte=now) | Q(next_attempt__isnull=True,
                                                   created__lte=now - retry)
        in_topic = Delivery.objects.filter(message__topic_id=topic.pk,
                                           message__state=Message.State.PENDING)
        # (ACKed deliveries keep when they were locked; their messages wait for their
        # timeout, so these are the rows the stale ones are found among.)
        consuming = in_topic.filter(last_attempt__gte=now - retry).values("account_id")
        stale = list(in_topic.filter(turn_ended, state=Delivery.State.PENDING).exclude(
            account_id__in=consuming).values_list(
                "pk", "account_id", "message_id", "message__priority")[:limit])
        if not stale:
            continue
        subs = subscribers([topic], now)().get(topic.pk, [])
        selective = has_selectors(subs)
        targets = receivers(subs, topic, now)
        with transaction.atomic():
            for pk, account_id, smuid, priority in stale:
                # Only if it is still waiting, unlocked, for that account (a session may
                # have locked it since it was read).
                same_turn = Delivery.objects.filter(turn_ended, pk=pk, account_id=account_id,
                                                    state=Delivery.State.PENDING)
                if selective:  # chosen per message (profile §9.2)
                    targets = receivers(subs, topic, now, stored_view(smuid))
                target = next_queue_consumer(targets, account_id)
                if target is None:
                    if same_turn.delete()[0]:
                        unassigned.append(smuid)
                        withdrawn.append((account_id, smuid))
                elif same_turn.update(account_id=target, next_attempt=now + retry):
                    moved.append(Published(smuid, topic.pk, topic.path,
                                           priority or NO_PRIORITY, [target]))
                    if target != account_id:
                        withdrawn.append((account_id, smuid))
            if unassigned:
                finish_messages(unassigned, now)
                released += len(unassigned)
                unassigned = []
    if withdrawn:
        notify.deliveries_withdrawn(withdrawn)
    if moved:
        notify.messages_committed(moved)
    return len(moved) + released
