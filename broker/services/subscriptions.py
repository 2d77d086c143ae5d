"""SUBSCRIBE / UNSUBSCRIBE for MESSAGE, TOPIC, SUBSCRIBERS and SERVER TIMEOUT.

Subscriptions belong to the account (they outlive sessions). Patterns are a topic or
``/t/*`` (every descendant, including topics created later); ``/*`` is refused with 510.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.domain.values import TopicPattern
from broker.models import Subscription, selector_key
from broker.store import messages as stored
from broker.store.rows import lock_topics
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot, current_generation, snapshot_for_id

from . import (
    Refusal,
    ServiceError,
    bad_request,
    events,
    federation,
    max_quantity,
    not_found,
    notify,
    too_large,
    unauthorized,
)
from . import topics as topic_service
from .deliveries import is_peer, receive_right
from .freshness import answer_from_fresh_caches
from .selectors import (
    Selector,
    canonical_class,
    compile_selector,
    view_of_message,
)

R = Subscription.Resource
SERVER_TIMEOUT_PATTERN = "TIMEOUT"
# The wire name of each resource in UNSUBSCRIBE replies (the draft's own examples).
WIRE_NAME = {R.MESSAGE: "MESSAGE", R.TOPIC: "TOPIC", R.SUBSCRIBERS: "SUB",
             R.SERVER: "SERVER"}


def _check_limits(account_id: int, adding: int) -> None:
    total = Subscription.objects.filter(account_id=account_id).count()
    if total + adding > settings.SMQP_MAX_SUBSCRIPTIONS_PER_ACCOUNT:
        raise too_large("cannot subscribe to any more")


@answer_from_fresh_caches
@transaction.atomic
def subscribe(snapshot: AccessSnapshot, resource: str, pattern: TopicPattern | None,
              since: datetime | None = None, lease: int | None = None,
              selector: tuple[str, str] | None = None) -> list[str]:
    """Record the subscription; returns the topics it covers now (the pattern itself when a
    wildcard matches none yet). MESSAGE only (profile §9.2, §9.3): ``lease`` seconds until
    it ends (400 unless positive; subscribing again renews it), ``selector`` its (class,
    text): 566 / 567 when refused. An account may hold several selectors on one pattern."""
    account = snapshot.account
    if (lease is not None or selector is not None) and resource != R.MESSAGE:
        raise bad_request("LEASE and SELECTOR are for MESSAGE subscriptions")
    if lease is not None and lease <= 0:
        raise bad_request("a lease must be a positive timeout")
    compiled = compile_selector(*selector) if selector is not None else None
    if resource == R.SERVER:
        _store(account.pk, R.SERVER, SERVER_TIMEOUT_PATTERN, None)
        return [SERVER_TIMEOUT_PATTERN]
    assert pattern is not None
    if pattern.wildcard and pattern.base in ("", "/"):
        raise max_quantity("cannot subscribe to every topic")
    if resource == R.MESSAGE:
        # Below a federation link's root, the topic may not be here before its first message.
        federation.make_link_topic(snapshot, pattern.base)
    if pattern.wildcard:
        matched = topic_service.matching_topics(snapshot, pattern)
    else:
        matched = [topic_service.visible_node(snapshot, pattern.base)]
    if resource == R.MESSAGE:
        # A peer server (federation) may subscribe with the subscribe right or the remote
        # right; what it receives is decided by the remote right alone (deliveries).
        right = receive_right(account)

        def may(t: Topic | Node) -> bool:
            return snapshot.allows(t, Right.SUBSCRIBE) or snapshot.allows(t, right)

        if not pattern.wildcard:
            if not may(matched[0]):
                raise unauthorized(f"no subscribe right on {matched[0].path}")
        else:
            base = topic_service.node(pattern.base)
            if base is not None and not may(base):
                # Below the base, only topics the account may subscribe to are covered.
                matched = [t for t in matched if may(t)]
                if not matched:
                    raise unauthorized(f"no subscribe right below {pattern.base}")
        if len(matched) > settings.SMQP_MAX_TOPICS_PER_SUBSCRIBE:
            raise max_quantity(
                f"a subscription may cover at most {settings.SMQP_MAX_TOPICS_PER_SUBSCRIBE} topics")
    lease_end = timezone.now() + timedelta(seconds=lease) if lease is not None else None
    created = _store(account.pk, resource, str(pattern), since, compiled, lease_end)
    if resource == R.MESSAGE:
        if created:
            # For the usage reports' subscribers peak (MESSAGE subscriptions open at once).
            events.record("subscribe", account=account.username, topic=str(pattern)[:1024])
            _announce_counts(matched)
        # Messages still held there that the account never got are delivered now (where
        # it may receive them: a peer, with the remote right).
        subscribe_backlog(account.pk, [t for t in matched if snapshot.allows(t, right)], since,
                          compiled)
    return [t.path for t in matched] or [str(pattern)]


def subscribe_backlog(account_id: int, topics: list[Topic | Node],
                      since: datetime | None, selector: Selector | None = None) -> int:
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
    # A peer (federation link) gets no Depth 0 message: it never leaves this server.
    peer = is_peer(account_id)
    if selector is not None:
        return sum(_selected_backlog(account_id, topic_ids, queue, since, now, selector,
                                     forwardable_only=peer)
                   for queue, topic_ids in by_mode.items() if topic_ids)
    return sum(stored.add_backlog(account_id, topic_ids, queue=queue, since=since, now=now,
                                  forwardable_only=peer)
               for queue, topic_ids in by_mode.items() if topic_ids)


def _selected_backlog(account_id: int, topic_ids: set[int], queue: bool,
                      since: datetime | None, now: datetime, selector: Selector, *,
                      forwardable_only: bool = False) -> int:
    """:func:`subscribe_backlog` for a subscription with a selector: the same messages as
    :func:`broker.store.messages.add_backlog`, read page by page and each offered to the
    selector (in Python: the selector is not SQL). ``forwardable_only``: a peer's, without
    Depth 0 messages."""
    added = 0
    after = 0
    while True:
        page = stored.backlog_candidates(account_id, topic_ids, queue=queue, since=since,
                                         now=now, after=after)
        if not page:
            return added
        after = page[-1][0].pk
        chosen = [message.pk for message, topic_path, publisher, content_type in page
                  if not (forwardable_only and message.depth == 0)
                  and selector.matches(view_of_message(message, topic=topic_path,
                                                       publisher=publisher,
                                                       content_type=content_type))]
        added += stored.add_deliveries_ignoring_existing(account_id, chosen, now)


def _store(account_id: int, resource: str, pattern: str, since: datetime | None,
           selector: Selector | None = None, lease_end: datetime | None = None) -> bool:
    """Create the subscription, or update the one with the same pattern and selector (its
    since-time; its lease, renewed or, without LEASE, lifted). True when created."""
    cls, text = (selector.cls, selector.text) if selector is not None else ("", "")
    existing = Subscription.objects.filter(
        account_id=account_id, resource=resource, pattern_key=pattern.casefold(),
        selector_key=selector_key(cls, text)).first()
    if existing is not None:
        if existing.since != since or existing.lease_end != lease_end:
            existing.since = since
            existing.lease_end = lease_end
            existing.save(update_fields=["since", "lease_end"])
        return False
    _check_limits(account_id, 1)
    Subscription.objects.create(account_id=account_id, resource=resource, pattern=pattern,
                                since=since, selector_class=cls, selector=text,
                                lease_end=lease_end)
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
                pattern: TopicPattern | None,
                selector: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """Remove the account's subscriptions the pattern names: exactly that pattern, every one
    at or below ``/t`` for ``/t/*``, every one for ``*``. Returns (wire resource, pattern)
    per removed subscription; 404 when none matched. With ``selector`` (class, text), only
    the subscription on exactly that pattern with that selector (568 when there is none)."""
    qs = Subscription.objects.filter(account=snapshot.account)
    if selector is not None:
        if resource != R.MESSAGE or pattern is None:
            raise bad_request("SELECTOR is for MESSAGE subscriptions")
        cls = canonical_class(selector[0])
        qs = qs.filter(resource=resource, pattern_key=str(pattern).casefold(),
                       selector_key=selector_key(cls, selector[1].strip()))
        if not qs.exists():
            raise ServiceError(Refusal.NO_SUCH_SUBSCRIPTION)
    if resource != "*":
        qs = qs.filter(resource=resource)
    if resource == R.SERVER:
        qs = qs.filter(pattern_key=SERVER_TIMEOUT_PATTERN.casefold())
    elif selector is not None:
        pass  # the exact pattern, chosen above
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
    _announce_removed(snapshot, removed)
    order = [R.MESSAGE, R.TOPIC, R.SUBSCRIBERS, R.SERVER]
    removed.sort(key=lambda s: (order.index(s.resource), s.pattern_key))
    return [(WIRE_NAME[s.resource], s.pattern) for s in removed]


@answer_from_fresh_caches
@transaction.atomic
def unsubscribe_one(snapshot: AccessSnapshot, subscription_id: int) -> Subscription:
    """Remove one of the account's subscriptions by its id (the REST door names them so);
    404 when the account has none with that id."""
    sub = Subscription.objects.filter(pk=subscription_id, account=snapshot.account).first()
    if sub is None:
        raise not_found("no such subscription")
    Subscription.objects.filter(pk=sub.pk).delete()
    _announce_removed(snapshot, [sub])
    return sub


def _announce_removed(snapshot: AccessSnapshot, removed: list[Subscription]) -> None:
    """NOTIFY SUB for the topics whose MESSAGE subscriber count these removals changed."""
    message_topics: dict[int, Topic] = {}
    for sub in removed:
        if sub.resource == R.MESSAGE:
            # "created": the reports count the subscriptions open when their day began.
            events.record("unsubscribe", account=snapshot.account.username,
                          topic=sub.pattern[:1024], created=sub.created.isoformat())
            patt = TopicPattern(sub.pattern[:-2], True) if sub.is_wildcard else \
                TopicPattern(sub.pattern, False)
            try:
                for t in topic_service.matching_topics(snapshot, patt):
                    message_topics[t.pk] = t
            except ServiceError:
                pass  # the topic is gone or hidden now: nobody to tell
    _announce_counts(list(message_topics.values()))


def wants_server_timeout(account_id: int) -> bool:
    """Has the account asked for NOTIFY SERVER TIMEOUT (SUB SERVER TIMEOUT)?"""
    return Subscription.objects.filter(account_id=account_id, resource=R.SERVER).exists()


def server_timeout_watchers() -> list[int]:
    return list(Subscription.objects.filter(resource=R.SERVER).values_list("account_id",
                                                                          flat=True))


# ------------------------------------------------------------------ subscriptions that end
# (profile §9.3): a lease runs out, the subscribe right is revoked, the topic is removed.
# Each ends by a DELETE that names the row as it was read, so that of several processes
# sweeping at once exactly one ends it, and tells the account's sessions.

#: The UAL generation whose rights this process last checked subscriptions against.
_rights_checked: int | None = None


def end_subscriptions(now: datetime | None = None, limit: int = 1000) -> int:
    """End the MESSAGE subscriptions whose lease has run out (``limit`` at most) and, when
    access rules changed since this process last looked, those whose account may no longer
    subscribe to their topic. Each account is told (:func:`.notify.
    subscription_cancelled_event`). Returns how many ended. What the Celery sweep and every
    listener's dispatcher run, every ``SMQP_SUBSCRIPTION_SWEEP_SECONDS``."""
    now = now or timezone.now()
    ended = 0
    with transaction.atomic():
        due = list(Subscription.objects.filter(lease_end__lte=now)
                   .order_by("lease_end", "pk")
                   .values_list("pk", "account_id", "pattern", "lease_end")[:limit])
        for pk, account_id, pattern, lease_end in due:
            # Not if it was renewed meanwhile (a new lease_end).
            if Subscription.objects.filter(pk=pk, lease_end=lease_end).delete()[0]:
                ended += 1
                notify.send_after_commit(
                    [account_id], notify.subscription_cancelled_event(pattern, notify.LEASE))
                _announce_ended(account_id, pattern)
    return ended + end_revoked()


def end_revoked(force: bool = False) -> int:
    """End the MESSAGE subscriptions whose account may no longer subscribe to what they
    name (its right revoked, directly or through a group): on an exact topic, the subscribe
    right there; on ``/t/*``, the right on ``/t`` or on some topic below it, as SUBSCRIBE
    asks. Only when the UAL generation moved since this process last checked (or
    ``force``). Disabled accounts keep theirs (they cannot log in; nothing is delivered to
    them meanwhile). Returns how many ended."""
    global _rights_checked
    generation = current_generation()
    # (Negative: the shared cache is unreachable, and every call gives a new number; the
    # scan waits for it rather than running every time.)
    if not force and (generation == _rights_checked or generation < 0):
        return 0
    ended = 0
    rows = list(Subscription.objects.filter(resource=R.MESSAGE).values_list(
        "pk", "account_id", "pattern", "pattern_key", "selector_key"))
    for pk, account_id, pattern, key, sel_key in rows:
        snapshot = snapshot_for_id(account_id)
        if not snapshot.account.is_active or _may_still_subscribe(snapshot, pattern):
            continue
        with transaction.atomic():
            if Subscription.objects.filter(pk=pk, pattern_key=key,
                                           selector_key=sel_key).delete()[0]:
                ended += 1
                notify.send_after_commit(
                    [account_id], notify.subscription_cancelled_event(pattern, notify.REVOKED))
                _announce_ended(account_id, pattern)
    _rights_checked = generation
    return ended


def _announce_ended(account_id: int, pattern: str) -> None:
    """NOTIFY SUB to the SUBSCRIBERS-watchers of the topics a MESSAGE subscription that
    ended covered (as UNSUB does)."""
    wildcard = pattern.endswith("/*")
    base = pattern[:-2] if wildcard else pattern
    try:
        if wildcard:
            covered = topic_service.matching_topics(snapshot_for_id(account_id),
                                                    TopicPattern(base, True))
        else:
            found = topic_service.node(base)
            covered = [found] if found is not None else []
    except ServiceError:
        return  # gone or hidden now: nobody to tell
    _announce_counts(covered)


def _may_still_subscribe(snapshot: AccessSnapshot, pattern: str) -> bool:
    wildcard = pattern.endswith("/*")
    base_path = pattern[:-2] if wildcard else pattern
    base = topic_service.node(base_path)
    if base is None:
        return True  # gone (REMOVE TOPIC ends those: .topics.remove_topic) or not there yet
    # As subscribe() decides: the subscribe right, or for a peer server the remote right.
    rights = {Right.SUBSCRIBE, receive_right(snapshot.account)}

    def allowed(topic: Topic | Node) -> bool:
        return any(snapshot.allows(topic, right) for right in rights)

    if allowed(base):
        return True
    if not wildcard:
        return False
    try:
        below = topic_service.matching_topics(snapshot, TopicPattern(base_path, True))
    except ServiceError:
        return False
    return any(allowed(t) for t in below)
