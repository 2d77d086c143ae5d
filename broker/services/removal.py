"""REMOVE MESSAGE (an extension, issue 22): a manager takes messages out of a topic into its
Trash, above all state messages (negative timeout), which would otherwise stay for good.

Each named message still pending on the topic moves to the topic's Trash, as an expired one
does (``GET MESSAGE /t/Trash`` shows it; REPUBLISH can bring it back; the Trash purge ends it);
its deliveries still open are withdrawn (dead for their accounts), so no backlog read offers it
again. Smuids that are not pending there are ignored. The SMQP door and the admin's "remove
into Trash" action both call :func:`remove_messages`.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from broker.domain.values import SmuidSet
from broker.models import Delivery, Message, UsageEvent
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import topics as topic_service
from . import unauthorized
from .freshness import answer_from_fresh_caches

#: ``detail`` of the usage event that records a removal (kind ``expire``: into Trash).
REMOVED = {"reason": "REMOVE MESSAGE"}


@answer_from_fresh_caches
@transaction.atomic
def remove_messages(snapshot: AccessSnapshot, path: str, smuids: SmuidSet, *,
                    include_removing: bool = False) -> list[int]:
    """REMOVE MESSAGE <topic> <smuid-list>: the manage right on the topic is needed (401;
    404 for a topic the account cannot see). ``include_removing``: also on a topic being
    removed (the admin's way to let go a topic that a state message holds). Returns the
    smuids moved into Trash."""
    topic = topic_service.get_visible(snapshot, path, include_removing=include_removing)
    if not snapshot.allows(topic, Right.MANAGE):
        raise unauthorized(f"no manage right on {topic.path}")
    real = topic.resolved()
    pending = Message.objects.select_for_update().filter(topic_id=real.pk,
                                                         state=Message.State.PENDING)
    if not smuids.all:
        singles = [lo for lo, hi in smuids.ranges if lo == hi]
        named = Q(pk__in=singles) if singles else Q()
        for lo, hi in smuids.ranges:
            if lo != hi:
                named |= Q(pk__gte=lo, pk__lte=hi)
        pending = pending.filter(named)
    ids = list(pending.order_by("pk").values_list("pk", flat=True))
    trash_messages(snapshot.account.username, real.path, ids)
    return ids


def trash_messages(account: str, topic_path: str, ids: list[int]) -> None:
    """Move pending messages ``ids`` (of the topic ``topic_path``, locked by the caller's
    transaction) into Trash, their open deliveries withdrawn; no rights checked here (the
    caller's rule: REMOVE MESSAGE's manage right, an XMPP publisher's own retract)."""
    if not ids:
        return
    now = timezone.now()
    Delivery.objects.filter(
        message_id__in=ids, state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED],
    ).update(state=Delivery.State.DEAD, last_attempt=now)
    Message.objects.filter(pk__in=ids).update(state=Message.State.TRASH, trashed=now)
    UsageEvent.objects.bulk_create([
        UsageEvent(kind=UsageEvent.Kind.EXPIRE, account=account,
                   topic=topic_path, smuid=smuid, detail=REMOVED)
        for smuid in ids])
