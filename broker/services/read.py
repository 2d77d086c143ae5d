"""Reading messages: what NOTIFY and GET MESSAGE send, what waits for an account (its
backlog), whether a delivery may still go, and a topic's delivery policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from django.conf import settings
from django.db.models import F, Q, Value, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from broker.domain import message as codec
from broker.domain.values import SmuidSet
from broker.models import DataSection, Delivery, Message
from topics import tree as topic_tree
from topics.models import Topic
from ual.models import Right
from ual.resolution import AccessSnapshot, snapshot_for_id

from . import bad_request, unauthorized
from . import topics as topic_service
from .ack import mark_dead
from .deliveries import NO_PRIORITY, effective, receive_right
from .freshness import answer_from_fresh_caches


def load_for_delivery(message_ids: list[int]) -> dict[int, tuple[str, str, codec.Message]]:
    """smuid → (topic path, Cmuid header, codec message) for NOTIFY and GET."""
    rows = Message.objects.filter(pk__in=message_ids).select_related("topic", "publisher")
    sections: dict[int, list[DataSection]] = defaultdict(list)
    for s in DataSection.objects.filter(message_id__in=message_ids).order_by("message", "position"):
        sections[s.message_id].append(s)
    out = {}
    for row in rows:
        publisher = row.publisher.username if row.publisher else "system"
        cmuid = f"{publisher}/{row.publisher_guid or publisher}/{row.cmuid}"
        msg = codec.Message(
            headers=[tuple(h) for h in row.headers],
            sections=[codec.DataSection(headers=[tuple(h) for h in s.headers],
                                        body=bytes(s.body)) for s in sections[row.pk]],
        )
        out[row.pk] = (row.topic.path, cmuid, msg)
    return out


def load_ahead(smuid: int, count: int,
               max_bytes: int) -> dict[int, tuple[str, str, codec.Message]]:
    """:func:`load_for_delivery` of ``smuid`` and of the pending messages published right
    after it, up to ``count`` of them and ``max_bytes`` of their data: a subscriber working
    through a backlog wants those next (read-ahead, as a disk's), and one query for many
    costs little more than one for one."""
    ids = [smuid]
    total = 0
    following = Message.objects.filter(pk__gt=smuid, pk__lt=smuid + count,
                                       state=Message.State.PENDING).order_by("pk")
    for pk, size in following.values_list("pk", "size"):
        total += size
        if total > max_bytes:
            break
        ids.append(pk)
    return load_for_delivery(ids)


def backlog_for(account_ids: list[int],
                limit: int | None = None) -> list[tuple[int, int, int]]:
    """(account, priority, smuid) of messages waiting for these accounts: not yet ACKed by
    the account, still pending and not expired, each account's in the order they must go
    (priority, then publish order). At most ``limit`` (``SMQP_BACKLOG_PAGE``) per account:
    its first ones in that order (one account's long backlog does not crowd out the
    others'), so a caller that got a full page asks again once it has sent these (the
    ACKed ones no longer wait)."""
    now = timezone.now()
    limit = limit or settings.SMQP_BACKLOG_PAGE
    order = (Coalesce("message__priority", Value(NO_PRIORITY)).asc(), F("message_id").asc())
    # Not the NOTIFIED ones: locked to a session (queue mode), they wait for its ACK.
    waiting = Delivery.objects.filter(
        account_id__in=account_ids,
        state=Delivery.State.PENDING,
        message__state=Message.State.PENDING,
    ).filter(Q(message__expires__isnull=True) | Q(message__expires__gt=now))
    if len(account_ids) > 1:
        waiting = waiting.annotate(rank=Window(RowNumber(), partition_by=[F("account_id")],
                                               order_by=order)).filter(rank__lte=limit)
    else:
        waiting = waiting.order_by(*order)[:limit]
    rows = waiting.values_list("account_id", "message__priority", "message_id")
    return sorted((a, p or NO_PRIORITY, m) for a, p, m in rows)


@answer_from_fresh_caches
def get_messages(snapshot: AccessSnapshot, path: str, smuids: SmuidSet,
                 after: int = 0) -> list[tuple[str, int, str, codec.Message]]:
    """GET MESSAGE: messages of the topic (or of its Trash) by smuid list; ``*`` for all.
    One page, in smuid order: those after smuid ``after``, at most ``SMQP_GET_PAGE`` of them
    and fewer once their data passes ``SMQP_GET_PAGE_BYTES`` (one at least). The caller asks
    again after the last one until a page comes back empty, so a reply of any length costs
    one page of memory."""
    base, trash = topic_service.split_trash(path)
    topic = topic_service.visible_node(snapshot, base)
    if not snapshot.allows(topic, Right.SUBSCRIBE):
        raise unauthorized(f"no subscribe right on {topic.path}")
    real = topic.resolved()
    # ``/t`` is the queue (what is pending), ``/t/Trash`` its Trash: as LIST and COUNT.
    qs = Message.objects.filter(
        topic_id=real.pk, state=Message.State.TRASH if trash else Message.State.PENDING)
    if not smuids.all:
        cond = Q()
        for lo, hi in smuids.ranges:
            cond |= Q(pk__gte=lo, pk__lte=hi)
        qs = qs.filter(cond)
    ids: list[int] = []
    size = 0
    for smuid, length in qs.filter(pk__gt=after).order_by("pk").values_list(
            "pk", "size")[:settings.SMQP_GET_PAGE]:
        if ids and size + length > settings.SMQP_GET_PAGE_BYTES:
            break
        ids.append(smuid)
        size += length
    loaded = load_for_delivery(ids)
    return [(loaded[i][0], i, loaded[i][1], loaded[i][2]) for i in ids if i in loaded]


def deliverable(account_id: int, smuid: int) -> bool:
    """May this message still be sent to this account? Its subscribe right on the message's
    topic may have been revoked since the delivery was recorded (at publish, or in a backlog).

    When it may not, the delivery is withdrawn: on a fan-out topic it is dead for that account
    (so the message's timeout is not held up by it; Trash for audit once nobody else waits);
    in queue mode it is left to the queue sweep
    (:func:`.sweeps.requeue_stale_queue_deliveries`), which hands it to a subscriber that may
    still receive it (it is not locked: this is asked before the lock)."""
    topic_id = Message.objects.filter(pk=smuid).values_list("topic_id", flat=True).first()
    if topic_id is None:
        return False
    topic = topic_tree.tree().by_id.get(topic_id)
    snap = snapshot_for_id(account_id)
    if topic is not None and snap.allows(topic, receive_right(snap.account)):
        return True
    if topic is None or topic.delivery_mode != Topic.DeliveryMode.QUEUE:
        mark_dead([(account_id, smuid)], reason="subscribe right revoked")
    return False


class DeliveryPolicy(NamedTuple):
    """How a topic's messages are delivered: the retry timeout (seconds) and max retries in
    effect on it, and whether it is in queue mode (each message locked to one session at a
    time: :mod:`.locks`)."""

    retry_timeout: int
    max_retries: int
    queue: bool


def delivery_window(n: int) -> int:
    """A session's delivery window (profile §9.7: SET NOTIFY WINDOW), 1 to the server's
    Max-Window; 400 otherwise, as SET NOTIFY refuses a bad value."""
    maximum = settings.SMQP_MAX_NOTIFY_WINDOW
    if not 1 <= n <= maximum:
        raise bad_request(f"window must be 1 to {maximum}")
    return n


def retry_policy(topic_path: str) -> DeliveryPolicy:
    """The :class:`DeliveryPolicy` in effect on a topic."""
    topic = topic_service.node(topic_path)
    real = topic.resolved() if topic else None
    params = effective(real) if real else settings.SMQP_QUEUE_DEFAULTS
    return DeliveryPolicy(int(params["retry_timeout"] or 30), int(params["max_retries"] or 0),
                          real is not None and real.delivery_mode == Topic.DeliveryMode.QUEUE)
