"""SUBSCRIBE / UNSUBSCRIBE for MESSAGE, TOPIC, SUBSCRIBERS and SERVER TIMEOUT.

Subscriptions belong to the account (they outlive sessions). Patterns are a topic or
``/t/*`` (every descendant, including topics created later); ``/*`` is refused with 510.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.domain.values import TopicPattern
from broker.models import Subscription
from broker.store import messages as stored
from broker.store.rows import lock_topics
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import ServiceError, events, not_found, notify, unauthorized
from . import topics as topic_service
from .freshness import answer_from_fresh_caches

R = Subscription.Resource
SERVER_TIMEOUT_PATTERN = "TIMEOUT"
# The wire name of each resource in UNSUBSCRIBE replies (the draft's own examples).
WIRE_NAME = {R.MESSAGE: "MESSAGE", R.TOPIC: "TOPIC", R.SUBSCRIBERS: "SUB",
             R.SERVER: "SERVER"}


def _too_many(reason: str) -> ServiceError:
    return ServiceError(510, f"Maximum quantity exceeded ({reason})")


def _check_limits(account_id: int, adding: int) -> None:
    total = Subscription.objects.filter(account_id=account_id).count()
    if total + adding > settings.SMQP_MAX_SUBSCRIPTIONS_PER_ACCOUNT:
        raise ServiceError(414, "Resource too large (cannot subscribe to any more)")


@answer_from_fresh_caches
@transaction.atomic
def subscribe(snapshot: AccessSnapshot, resource: str, pattern: TopicPattern | None,
              since: datetime | None = None) -> list[str]:
    """Record the subscription; returns the topics it covers now (the pattern itself when a
    wildcard matches none yet)."""
    account = snapshot.account
    if resource == R.SERVER:
        _store(account.pk, R.SERVER, SERVER_TIMEOUT_PATTERN, None)
        return [SERVER_TIMEOUT_PATTERN]
    assert pattern is not None
    if pattern.wildcard and pattern.base in ("", "/"):
        raise _too_many("cannot subscribe to every topic")
    if pattern.wildcard:
        matched = topic_service._matching(snapshot, pattern)
    else:
        matched = [topic_service.visible_node(snapshot, pattern.base)]
    if resource == R.MESSAGE:
        if not pattern.wildcard:
            if not snapshot.allows(matched[0], Right.SUBSCRIBE):
                raise unauthorized(f"no subscribe right on {matched[0].path}")
        else:
            base = topic_service.node(pattern.base)
            if base is not None and not snapshot.allows(base, Right.SUBSCRIBE):
                # Below the base, only topics the account may subscribe to are covered.
                matched = [t for t in matched if snapshot.allows(t, Right.SUBSCRIBE)]
                if not matched:
                    raise unauthorized(f"no subscribe right below {pattern.base}")
        if len(matched) > settings.SMQP_MAX_TOPICS_PER_SUBSCRIBE:
            raise _too_many(
                f"a subscription may cover at most {settings.SMQP_MAX_TOPICS_PER_SUBSCRIBE} topics")
    created = _store(account.pk, resource, str(pattern), since)
    if resource == R.MESSAGE:
        if created:
            # For the usage reports' subscribers peak (MESSAGE subscriptions open at once).
            events.record("subscribe", account=account.username, topic=str(pattern)[:1024])
            _announce_counts(matched)
        # Messages still held there that the account never got are delivered now.
        subscribe_backlog(account.pk, matched, since)
    return [t.path for t in matched] or [str(pattern)]


def subscribe_backlog(account_id: int, topics: list[Topic | Node],
                      since: datetime | None) -> int:
    """A new MESSAGE subscription: messages still held on these topics (published after
    ``since``, not expired) that the account never got become pending deliveries for it,
    however many there are (one INSERT ... SELECT each kind of topic; the session reads
    them page by page). On a topic in delivery mode ``queue`` only messages no subscriber
    holds yet: each message goes to one subscriber. Returns how many deliveries were
    added."""
    now = timezone.now()
    by_mode: dict[bool, set[int]] = defaultdict(set)
    for topic in topics:
        target = topic.resolved()
        by_mode[target.delivery_mode == Topic.DeliveryMode.QUEUE].add(target.pk)
    # A publish batch under way on these topics commits first, or sees this subscription.
    lock_topics(by_mode[False] | by_mode[True], exclusive=True)
    return sum(stored.add_backlog(account_id, topic_ids, queue=queue, since=since, now=now)
               for queue, topic_ids in by_mode.items() if topic_ids)


def _store(account_id: int, resource: str, pattern: str, since: datetime | None) -> bool:
    existing = Subscription.objects.filter(
        account_id=account_id, resource=resource, pattern_key=pattern.casefold()).first()
    if existing is not None:
        if existing.since != since:
            existing.since = since
            existing.save(update_fields=["since"])
        return False
    _check_limits(account_id, 1)
    Subscription.objects.create(account_id=account_id, resource=resource, pattern=pattern,
                                since=since)
    return True


def _announce_counts(topics: list[Topic]) -> None:
    """NOTIFY SUB to SUBSCRIBERS-subscribers of each topic whose subscriber count changed."""
    for topic in topics:
        watchers = topic_service.subscriber_accounts(topic, R.SUBSCRIBERS)
        if watchers:
            count = len(topic_service.subscriber_accounts(topic))
            notify.send_after_commit(watchers, notify.subscribers_event(topic.path, count))


@answer_from_fresh_caches
@transaction.atomic
def unsubscribe(snapshot: AccessSnapshot, resource: str,
                pattern: TopicPattern | None) -> list[tuple[str, str]]:
    """Remove the account's subscriptions the pattern names: exactly that pattern, every one
    at or below ``/t`` for ``/t/*``, every one for ``*``. Returns (wire resource, pattern)
    per removed subscription; 404 when none matched."""
    qs = Subscription.objects.filter(account=snapshot.account)
    if resource != "*":
        qs = qs.filter(resource=resource)
    if resource == R.SERVER:
        qs = qs.filter(pattern_key=SERVER_TIMEOUT_PATTERN.casefold())
    elif pattern is not None and not (pattern.wildcard and pattern.base in ("", "/")):
        base = pattern.base.casefold()
        if pattern.wildcard:
            qs = qs.filter(pattern_key__startswith=base + "/")
        else:
            qs = qs.filter(pattern_key=base)
    removed = list(qs.order_by("resource", "pattern_key"))
    if not removed:
        raise not_found("no such subscription")
    qs.filter(pk__in=[s.pk for s in removed]).delete()
    message_topics: dict[int, Topic] = {}
    for sub in removed:
        if sub.resource == R.MESSAGE:
            # "created": the reports count the subscriptions open when their day began.
            events.record("unsubscribe", account=snapshot.account.username,
                          topic=sub.pattern[:1024], created=sub.created.isoformat())
            patt = TopicPattern(sub.pattern[:-2], True) if sub.is_wildcard else \
                TopicPattern(sub.pattern, False)
            try:
                for t in topic_service._matching(snapshot, patt):
                    message_topics[t.pk] = t
            except ServiceError:
                pass  # the topic is gone or hidden now: nobody to tell
    _announce_counts(list(message_topics.values()))
    order = [R.MESSAGE, R.TOPIC, R.SUBSCRIBERS, R.SERVER]
    removed.sort(key=lambda s: (order.index(s.resource), s.pattern_key))
    return [(WIRE_NAME[s.resource], s.pattern) for s in removed]


def wants_server_timeout(account_id: int) -> bool:
    """Has the account asked for NOTIFY SERVER TIMEOUT (SUB SERVER TIMEOUT)?"""
    return Subscription.objects.filter(account_id=account_id, resource=R.SERVER).exists()


def server_timeout_watchers() -> list[int]:
    return list(Subscription.objects.filter(resource=R.SERVER).values_list("account_id",
                                                                          flat=True))
