"""Who a message goes to, on what terms, and when its timeout starts (profile §8).

Shared by every verb that makes deliveries: publish, republish, receipts, queue-mode locks
and the queue-mode sweep. The statements are the store's (:mod:`broker.store.messages`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import NamedTuple

from broker.models import Message
from broker.store import messages as stored
from broker.store.rows import from_db_datetime
from topics import tree as topic_tree
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import snapshot_for_id

from . import topics as topic_service
from .selectors import MessageView, Selector, stored_selector, view_of_message

#: Sort key of a message without Priority: after every message that has one.
NO_PRIORITY = 2**31


def effective(topic: Topic | Node) -> dict[str, int | None]:
    """Queue parameters in effect on a topic (from the in-memory tree)."""
    tree = topic_tree.tree()
    found = tree.by_id.get(topic.pk)
    if found is None:  # created in this very transaction: not in any tree yet
        return {name: value for name, (value, _) in Topic.objects.get(
            pk=topic.pk).effective_parameters().items()}
    return tree.effective(found)


class Sub(NamedTuple):
    """A MESSAGE subscription covering a topic: whose, since when, and its selector (None:
    every message)."""

    account: int
    since: datetime | None
    selector: Selector | None = None


def subscribers(topics: list[Topic | Node],
                now: datetime) -> Callable[[], dict[int, list[Sub]]]:
    """For each topic id: the MESSAGE subscriptions covering it (:class:`Sub`), by its own
    name or the name of a virtual topic linking to it, but none whose lease has ended. The
    query is sent at once; the returned function reads its answer (see
    :func:`broker.store.rows.query`)."""
    tree = topic_tree.tree()
    wanted: dict[str, list[int]] = defaultdict(list)
    for topic in topics:
        for key in topic_service.covering_patterns(topic.key):
            wanted[key].append(topic.pk)
        known = tree.by_id.get(topic.pk)
        for virtual_id in known.virtual_ids if known is not None else ():
            for key in topic_service.covering_patterns(tree.by_id[virtual_id].key):
                wanted[key].append(topic.pk)
    if not wanted:
        return lambda: {}
    rows = stored.message_subscriptions(list(wanted), now)

    def read() -> dict[int, list[Sub]]:
        result: dict[int, list[Sub]] = defaultdict(list)
        for key, account_id, since, selector_class, selector_text in rows():
            sub = Sub(account_id, from_db_datetime(since),
                      stored_selector(selector_class, selector_text))
            for topic_id in wanted[key]:
                result[topic_id].append(sub)
        return result

    return read


def receivers(subscriptions: Iterable[Sub], topic: Topic | Node, now: datetime,
              view: MessageView | Callable[[], MessageView] | None = None) -> list[int]:
    """The accounts to deliver a message of ``topic`` published ``now`` to, from the
    subscriptions covering it (:func:`subscribers`): those whose since-time has come, whose
    selector (if any) the message satisfies, and that may (still) receive from it,
    ascending. An account is named once however many of its subscriptions match.
    ``view``: what selectors see of the message (or a function that builds it, called only
    if a selector needs it); without one, a subscription with a selector takes nothing."""
    return may_receive(selected(subscriptions, now, view), topic)


def selected(subscriptions: Iterable[Sub], now: datetime,
             view: MessageView | Callable[[], MessageView] | None) -> list[int]:
    """The accounts among ``subscriptions`` that take the message (see :func:`receivers`),
    before the access check."""
    plain: set[int] = set()
    selective: list[Sub] = []
    for sub in subscriptions:
        if sub.since is not None and sub.since > now:
            continue
        if sub.selector is None:
            plain.add(sub.account)
        else:
            selective.append(sub)
    if selective and view is not None:
        built: MessageView | None = None
        for sub in selective:
            if sub.account in plain:
                continue
            if built is None:
                built = view() if callable(view) else view
            if sub.selector is not None and sub.selector.matches(built):
                plain.add(sub.account)
    return list(plain)


def has_selectors(subscriptions: Iterable[Sub]) -> bool:
    return any(sub.selector is not None for sub in subscriptions)


def stored_view(smuid: int) -> Callable[[], MessageView]:
    """A function giving the view of a stored message (read when first called)."""

    def build() -> MessageView:
        message = Message.objects.select_related("topic", "publisher").get(pk=smuid)
        first = message.sections.order_by("position").values_list("content_type",
                                                                   flat=True).first()
        return view_of_message(
            message, topic=message.topic.path,
            publisher=message.publisher.username if message.publisher else None,
            content_type=first)

    return build


def may_receive(account_ids: list[int], topic: Topic | Node) -> list[int]:
    """The accounts among ``account_ids`` that may (still) subscribe to ``topic``, from the
    cached access snapshots (a deleted or disabled account may not)."""
    found = set()
    for a in account_ids:
        snap = snapshot_for_id(a)
        if snap.allows(topic, receive_right(snap.account)):
            found.add(a)
    return sorted(found)


def receive_right(account) -> str:
    """The right an account needs to receive from a topic: ``remote`` for another server
    (profile §9.5: the accepting side decides what a peer may receive), ``subscribe`` for
    any other account."""
    return Right.REMOTE if account.is_remote_server else Right.SUBSCRIBE


def is_peer(account_id: int) -> bool:
    """Is this account another SMQP server (a federation link logs in with it)?"""
    return snapshot_for_id(account_id).account.is_remote_server


def forwardable(accounts: list[int], depth: int) -> list[int]:
    """The accounts among ``accounts`` a message of this ``Depth`` goes to: every one, but
    a message whose Depth is 0 never leaves this server (draft §2.3), so not to a peer."""
    if depth != 0:
        return accounts
    return [a for a in accounts if not is_peer(a)]


def pick_queue_consumer(accounts: list[int], smuid: int) -> int:
    """Queue mode: each message to exactly one subscribing account, in turn."""
    return accounts[smuid % len(accounts)]


def next_queue_consumer(accounts: list[int], after: int) -> int | None:
    """Queue mode: whose turn it is once ``after``'s turn with a message ended: the next of
    ``accounts`` (ascending) after it, round robin; ``after`` again when it is the only one;
    None when there is nobody."""
    for account_id in accounts:
        if account_id > after:
            return account_id
    return accounts[0] if accounts else None


def start_timeouts(message_ids: list[int], now: datetime) -> None:
    """The timeout of these messages starts now: set their expiry (none for state
    messages, whose timeout is negative)."""
    if message_ids:
        stored.start_timeouts(
            list(Message.objects.filter(pk__in=message_ids).values_list("pk", "timeout")), now)
