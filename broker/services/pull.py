"""Pull consumption (the REST door's pull/ack/nack, like an SQS or Pub/Sub pull client):
messages waiting for an account on the topics one of its MESSAGE subscriptions covers,
each locked to the caller with the queue locks of profile §9.6 (:mod:`.locks`), on queue
and fan-out topics alike.

A pull takes a *holder* (one per pull, never an SMQP session's guid) and locks up to
``limit`` waiting deliveries to it until the topic's retry timeout; the caller hands out
``<smuid>.<token>`` receipts. An ACK with a receipt consumes the message only while its lock
holds (:func:`.locks.ack_locked`: once, whatever door or process asks); a NACK ends the
lock at once (:func:`.locks.release_held`); an expired receipt gets 409 and changes nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from broker.domain import message as codec
from broker.domain.values import TopicPattern
from broker.models import Delivery, Message, Subscription
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import ServiceError, bad_request, conflict, not_found, notify
from . import topics as topic_service
from .ack import may_want_receipt
from .deliveries import NO_PRIORITY, effective, stored_view
from .locks import ack_locked, lock, release_held
from .publish import Published
from .read import load_for_delivery
from .selectors import Selector, stored_selector

#: A pull looks at most this many pages of candidates before it answers with what it got.
CANDIDATE_PAGES = 5
#: Holders of REST locks start with this; account names (and so SMQP guids) cannot hold ":".
HOLDER_PREFIX = "rest:"


@dataclass
class Pulled:
    """One message locked to a pull: its receipt and the lock's deadline."""

    smuid: int
    receipt: str
    deadline: datetime
    attempts: int
    topic: str
    cmuid: str
    message: codec.Message


def new_holder() -> tuple[str, str]:
    """(holder, token): a fresh holder for one pull; the token goes into its receipts."""
    token = secrets.token_urlsafe(16)
    return HOLDER_PREFIX + token, token


def parse_receipt(receipt: str) -> tuple[int, str]:
    """``<smuid>.<token>`` → (smuid, holder); 409 for anything else (an unknown receipt is
    one whose lock is not held)."""
    smuid, sep, token = receipt.partition(".")
    if not sep or not smuid.isascii() or not smuid.isdigit() or len(smuid) > 18 or not token \
            or len(token) > 64 or not all(c.isalnum() or c in "-_" for c in token):
        raise conflict("unknown receipt")
    return int(smuid), HOLDER_PREFIX + token


def subscription_of(snapshot: AccessSnapshot, subscription_id: int) -> Subscription:
    """The account's own subscription (404 for another account's or none)."""
    sub = Subscription.objects.filter(pk=subscription_id, account=snapshot.account).first()
    if sub is None:
        raise not_found("no such subscription")
    return sub


def covered_topics(snapshot: AccessSnapshot, sub: Subscription) -> dict[int, Node]:
    """The real topics a MESSAGE subscription covers now that the account may subscribe to,
    by id (none when its topic is gone or hidden since)."""
    if sub.resource != Subscription.Resource.MESSAGE:
        raise bad_request("only MESSAGE subscriptions have messages to pull")
    pattern = TopicPattern(sub.pattern[:-2], True) if sub.is_wildcard else \
        TopicPattern(sub.pattern, False)
    try:
        matched = topic_service.matching_topics(snapshot, pattern)
    except ServiceError:
        return {}
    return {t.resolved().pk: t.resolved() for t in matched
            if snapshot.allows(t, Right.SUBSCRIBE)}


def _own_selector(sub: Subscription) -> Selector | None:
    """The selector a pull of ``sub`` must apply itself, or None. Deliveries are the
    account's, made when any of its subscriptions selected the message: with a selector
    and no other MESSAGE subscription of the account, every waiting delivery is one this
    selector took (no need to look at the messages); otherwise another subscription may
    have taken it, and this pull hands out only what its own selector takes."""
    if not sub.selector_class:
        return None
    if not Subscription.objects.filter(account_id=sub.account_id,
                                       resource=Subscription.Resource.MESSAGE).exclude(
                                           pk=sub.pk).exists():
        return None
    return stored_selector(sub.selector_class, sub.selector)


def _selects(selector: Selector, smuid: int) -> bool:
    try:
        return selector.matches(stored_view(smuid)())
    except Message.DoesNotExist:  # deleted meanwhile (expired, topic removed)
        return False


def pull(snapshot: AccessSnapshot, subscription_id: int, limit: int) -> list[Pulled]:
    """Lock up to ``limit`` messages waiting for the account on the subscription's topics,
    in delivery order (priority, then publish order), to a new holder. Empty when none
    waits (the caller may ask again: long polling)."""
    sub = subscription_of(snapshot, subscription_id)
    topics = covered_topics(snapshot, sub)
    if not topics:
        return []
    account_id = snapshot.account.pk
    holder, token = new_holder()
    now = timezone.now()
    order = (Coalesce("message__priority", Value(NO_PRIORITY)).asc(), F("message_id").asc())
    # Waiting, or locked by a lock past its deadline that no sweep has ended yet (the lock
    # statement takes such a lock over for the same account, as a session's does).
    free = Q(state=Delivery.State.PENDING) | Q(state=Delivery.State.NOTIFIED,
                                               next_attempt__lte=now)
    waiting = Delivery.objects.filter(
        free, account_id=account_id,
        message__state=Message.State.PENDING, message__topic_id__in=list(topics),
    ).filter(Q(message__expires__isnull=True) | Q(message__expires__gt=now)).order_by(*order)
    only = _own_selector(sub)
    locked: list[int] = []
    tried: list[int] = []
    # Candidates a page at a time (twice what is asked for): other consumers of the account
    # race for the same first ones, and each one lost is skipped, not the rest of the queue.
    for _ in range(CANDIDATE_PAGES):
        page = list(waiting.exclude(message_id__in=tried).values_list(
            "message_id", "message__topic_id")[:limit * 2])
        for smuid, topic_id in page:
            tried.append(smuid)
            if only is not None and not _selects(only, smuid):
                continue  # waits for the account's subscription that selected it
            params = effective(topics[topic_id])
            if lock(account_id, holder, smuid, int(params["retry_timeout"] or 30),
                    int(params["max_retries"] or 0)):
                locked.append(smuid)
                if len(locked) >= limit:
                    break
        if len(locked) >= limit or len(page) < limit * 2:
            break
    if not locked:
        return []
    held = {m: (deadline, attempts) for m, deadline, attempts in Delivery.objects.filter(
        account_id=account_id, message_id__in=locked, holder=holder).values_list(
            "message_id", "next_attempt", "attempts")}
    loaded = load_for_delivery(locked)
    return [Pulled(smuid, f"{smuid}.{token}", held[smuid][0], held[smuid][1],
                   loaded[smuid][0], loaded[smuid][1], loaded[smuid][2])
            for smuid in locked if smuid in loaded and smuid in held]


def ack(snapshot: AccessSnapshot, receipt: str) -> list[Published]:
    """Consume the message of a receipt (409 when its lock is not held or has expired).
    The receipts to publishers it sent are announced once committed, and returned."""
    smuid, holder = parse_receipt(receipt)
    wants = Message.objects.filter(pk=smuid).values_list("receipt", flat=True).first()
    receipts = ack_locked(snapshot.account.pk, holder, smuid,
                          receipt=bool(wants) if wants is not None else True, door="rest")
    notify.messages_committed_on_commit(receipts)
    return receipts


def nack(snapshot: AccessSnapshot, receipt: str) -> list[Published]:
    """End the lock of a receipt at once: the message goes to the next subscriber (queue
    topics) or waits for this account again (fan-out), or is dead once its attempts are
    spent. 409 when the lock is not held or has expired. The messages moved are announced
    once committed, and returned."""
    smuid, holder = parse_receipt(receipt)
    moved = release_held(snapshot.account.pk, holder, smuid)
    notify.messages_committed_on_commit(moved)
    return moved


__all__ = ["Pulled", "ack", "covered_topics", "may_want_receipt", "nack", "parse_receipt",
           "pull", "subscription_of"]
