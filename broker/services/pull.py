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
from enum import StrEnum

from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from broker.domain import message as codec
from broker.domain.values import TopicPattern
from broker.models import Delivery, Message, Subscription
from topics import tree as topic_tree
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import ServiceError, bad_request, conflict, not_found, notify
from . import topics as topic_service
from .ack import may_want_receipt
from .deliveries import NO_PRIORITY, effective, stored_view
from .locks import ack_locked_many, lock_many, release_held
from .publish import Published
from .read import load_for_delivery
from .selectors import Selector, stored_selector

#: A pull looks at most this many pages of candidates before it answers with what it got.
CANDIDATE_PAGES = 5
#: A page of candidates holds twice what a pull asks for and this many more: with ``max`` 1,
#: a few racing pullers of one account still find a free one in their first page.
CANDIDATE_SLACK = 8
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


def pull(snapshot: AccessSnapshot, subscription: int | Subscription, limit: int) -> list[Pulled]:
    """Lock up to ``limit`` messages waiting for the account on the subscription's topics,
    in delivery order (priority, then publish order), to a new holder. Empty when none
    waits (the caller may ask again: long polling). ``subscription``: its id, or the row
    :func:`subscription_of` gave."""
    sub = subscription if isinstance(subscription, Subscription) else \
        subscription_of(snapshot, subscription)
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
    locked: dict[int, tuple[datetime, int]] = {}  # smuid → (deadline, attempts)
    tried: dict[int, int] = {}  # smuid → its place in delivery order
    # Candidates a page at a time (more than asked for): other consumers of the account race
    # for the same first ones, and those lost are skipped, not the rest of the queue.
    page_size = limit * 2 + CANDIDATE_SLACK
    for _ in range(CANDIDATE_PAGES):
        rows = list(waiting.exclude(message_id__in=list(tried)).values_list(
            "message_id", "message__topic_id")[:page_size])
        for smuid, _topic in rows:
            tried[smuid] = len(tried)
        page = rows if only is None else \
            [(smuid, topic_id) for smuid, topic_id in rows if _selects(only, smuid)]
        while page and len(locked) < limit:
            # As many as are still wanted, in one statement per topic policy: each row is
            # locked or not on its own conditions (a race lost only leaves it out).
            want, page = page[:limit - len(locked)], page[limit - len(locked):]
            for (retry, retries), smuids in _by_policy(want, topics).items():
                locked.update(lock_many(account_id, holder, smuids, retry, retries))
        if len(locked) >= limit or len(rows) < page_size:
            break
    if not locked:
        return []
    loaded = load_for_delivery(list(locked))
    return [Pulled(smuid, f"{smuid}.{token}", deadline, attempts, *loaded[smuid])
            for smuid, (deadline, attempts) in sorted(locked.items(),
                                                      key=lambda kv: tried[kv[0]])
            if smuid in loaded]


def _by_policy(candidates: list[tuple[int, int]],
               topics: dict[int, Node]) -> dict[tuple[int, int], list[int]]:
    """(smuid, topic id) → smuids by their topics' (retry timeout, max retries)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for smuid, topic_id in candidates:
        params = effective(topics[topic_id])
        policy = (int(params["retry_timeout"] or 30), int(params["max_retries"] or 0))
        groups.setdefault(policy, []).append(smuid)
    return groups


def ack(snapshot: AccessSnapshot, receipt: str) -> list[Published]:
    """Consume the message of a receipt (409 when its lock is not held or has expired).
    The receipts to publishers it sent are announced once committed, and returned."""
    smuid, holder = parse_receipt(receipt)
    consumed, receipts = ack_locked_many(snapshot.account.pk, {holder: [smuid]},
                                         _wanting([smuid]))
    if not consumed:
        raise conflict("lock not held")
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


#: Receipts one batch ACK or NACK may carry (Pub/Sub takes up to 2,500 ack ids a request,
#: SQS 10): a few times the largest pull, and a request body of about 40 kB at most.
RECEIPTS_MAX = 1000


class Outcome(StrEnum):
    """What became of one receipt of a batch, with the HTTP status a single request
    would get for it."""

    CONSUMED = "consumed"
    RELEASED = "released"
    EXPIRED = "expired"
    UNKNOWN = "unknown"

    @property
    def status(self) -> int:
        return {"consumed": 204, "released": 204, "expired": 409, "unknown": 404}[self.value]


def ack_many(snapshot: AccessSnapshot,
             receipts: list[str]) -> tuple[list[Outcome], list[Published]]:
    """Consume the messages of several receipts in one transaction: each is consumed only
    while its own lock holds, as by :func:`ack`. Returns each receipt's outcome, in order
    (a receipt twice: the second finds its lock gone), and the receipts to publishers
    sent, announced once committed."""
    parsed = _parse_all(receipts)
    held: dict[str, set[int]] = {}
    for one in parsed:
        if one is not None:
            held.setdefault(one[0], set()).add(one[1])
    smuids = sorted({one[1] for one in parsed if one is not None})
    consumed, sent = ack_locked_many(
        snapshot.account.pk, {holder: sorted(mine) for holder, mine in held.items()},
        _wanting(smuids)) if smuids else (set(), [])
    outcomes: list[Outcome | None] = []
    for one in parsed:
        if one is not None and one in consumed:
            consumed.discard(one)  # once: the same receipt again finds no lock
            outcomes.append(Outcome.CONSUMED)
        else:
            outcomes.append(None)
    notify.messages_committed_on_commit(sent)
    return _refused(snapshot, parsed, outcomes), sent


def nack_many(snapshot: AccessSnapshot,
              receipts: list[str]) -> tuple[list[Outcome], list[Published]]:
    """:func:`nack` of each receipt, in order (each lock ends in a transaction of its own,
    as a single NACK's). Returns the outcomes and the messages moved (announced once
    committed)."""
    parsed = _parse_all(receipts)
    moved: list[Published] = []
    outcomes: list[Outcome | None] = []
    for one in parsed:
        if one is None:
            outcomes.append(None)
            continue
        try:
            moved += release_held(snapshot.account.pk, one[0], one[1])
        except ServiceError:
            outcomes.append(None)
        else:
            outcomes.append(Outcome.RELEASED)
    notify.messages_committed_on_commit(moved)
    return _refused(snapshot, parsed, outcomes), moved


def _parse_all(receipts: list[str]) -> list[tuple[str, int] | None]:
    """(holder, smuid) of each receipt; None for one that does not parse."""
    out: list[tuple[str, int] | None] = []
    for receipt in receipts:
        try:
            smuid, holder = parse_receipt(receipt)
        except ServiceError:
            out.append(None)
        else:
            out.append((holder, smuid))
    return out


def _refused(snapshot: AccessSnapshot, parsed: list[tuple[str, int] | None],
             outcomes: list[Outcome | None]) -> list[Outcome]:
    """The outcomes with each refusal (None) told apart: *expired* when the message is on a
    topic the account may subscribe to (its lock is not held, or has ended), *unknown*
    otherwise: no such message, or one the account may not see (the same answer)."""
    refused = {one[1] for one, outcome in zip(parsed, outcomes, strict=True)
               if outcome is None and one is not None}
    visible: set[int] = set()
    if refused:
        tree = topic_tree.tree()
        for smuid, topic_id in Message.objects.filter(pk__in=refused).values_list(
                "pk", "topic_id"):
            node = tree.by_id.get(topic_id)
            if node is not None and snapshot.allows(node, Right.SUBSCRIBE):
                visible.add(smuid)
    return [outcome if outcome is not None else
            Outcome.EXPIRED if one is not None and one[1] in visible else Outcome.UNKNOWN
            for one, outcome in zip(parsed, outcomes, strict=True)]


def _wanting(smuids: list[int]) -> set[int]:
    """Those of the messages that ask for a receipt at their first ACK."""
    return set(Message.objects.filter(pk__in=smuids, receipt=True).values_list(
        "pk", flat=True))


__all__ = ["RECEIPTS_MAX", "Outcome", "Pulled", "ack", "ack_many", "covered_topics",
           "may_want_receipt", "nack", "nack_many", "parse_receipt", "pull", "subscription_of"]
