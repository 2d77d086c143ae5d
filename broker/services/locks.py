"""Queue mode with locks (profile §9.6): each message of a queue topic is consumed exactly
once, by one subscribing account, whichever process or door its sessions use.

A queue message has one delivery row, for the account whose turn it is. Before a session
sends it, the session *locks* it (:func:`lock`): the row becomes NOTIFIED, with the session's
guid as ``holder`` and a deadline (now + the topic's retry timeout) in ``next_attempt``; each
lock counts an attempt. Only the holder's ACK before the deadline consumes the message
(:func:`ack_locked`); any other is refused with 409 and changes nothing. A lock ends when the
holder's session ends or lets go of it (:func:`release`), or at its deadline
(:func:`expire_locks`, a Celery sweep, for sessions whose process is gone): the message is
then offered to the next subscribing account (:func:`.deliveries.next_queue_consumer`), or,
once the topic's max retries are spent, it is dead (Trash, for audit).

Each verb is one short transaction of conditional UPDATEs that name the delivery row's own
columns only, so that of two processes deciding about one delivery at once exactly one wins:
the database checks those conditions again on the row version it updates (PostgreSQL does
not for a condition it read through a join or a subquery on the row's table). The two that
run once per message, :func:`lock` and :func:`ack_locked`, are the store's statements
(:mod:`broker.store.messages`) in a hot transaction, as an ACK batch is.

Fan-out deliveries take no lock over SMQP: they keep the ACK journal's path (:mod:`.ack`).
A REST pull (:mod:`.pull`) locks them all the same, to give its receipts one meaning for
both kinds of topic; such a lock ends with the delivery waiting for the same account again
(each account has its own copy of a fan-out message), or dead once its attempts are spent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from accounts.models import Account
from broker.models import Delivery, UsageEvent
from broker.store import messages as stored
from broker.store.rows import hot_transaction
from topics import tree as topic_tree
from topics.models import Topic
from ual.resolution import snapshot_for_id

from . import conflict, notify
from .ack import send_receipts
from .deliveries import (
    NO_PRIORITY,
    Sub,
    has_selectors,
    next_queue_consumer,
    receivers,
    stored_view,
    subscribers,
)
from .publish import Published

LOCKED = Delivery.State.NOTIFIED

__all__ = ["LockAck", "LockTake", "ack_locked", "ack_locked_many", "expire_locks", "lock",
           "lock_many", "release", "release_held", "settle"]


@dataclass(frozen=True)
class LockTake:
    """A session's request to lock a queue message before sending it (as :func:`lock`)."""

    account_id: int
    holder: str
    smuid: int
    retry_timeout: int
    max_retries: int


@dataclass(frozen=True)
class LockAck:
    """The ACK of a queue message by the session holding its lock (as :func:`ack_locked`)."""

    account_id: int
    holder: str
    smuid: int
    receipt: bool = True
    door: str = "smqp"


def lock(account_id: int, session_guid: str, smuid: int, retry_timeout: int,
         max_retries: int) -> bool:
    """Lock a queue message to a session before it is sent; False when the session may not
    send it. It may when the delivery is its account's turn and is not locked, or is locked
    to this session already (sent again), or its lock has expired; and when the message
    still waits and has attempts left (``max_retries``, of its topic: the caller's cached
    policy, with ``retry_timeout``). Counts the attempt. Committed as an ACK is (without a
    disk flush unless ``SMQP_ACK_DURABILITY=full``): a lock lost with the machine only
    lets the message be sent again."""
    [took], _, _ = settle([LockTake(account_id, session_guid, smuid, retry_timeout,
                                    max_retries)], [])
    return took


def lock_many(account_id: int, holder: str, smuids: list[int], retry_timeout: int,
              max_retries: int) -> dict[int, tuple[datetime, int]]:
    """:func:`lock` of several messages (a REST pull's page) in one transaction and one
    statement: each is locked or not on its own row's conditions, as if alone. Returns
    smuid → (the lock's deadline, attempts with this one) of those now locked to
    ``holder``."""
    if not smuids:
        return {}
    now = timezone.now()
    deadline = now + timedelta(seconds=retry_timeout)
    with hot_transaction(relaxed=settings.SMQP_ACK_DURABILITY != "full"):
        won = stored.lock_deliveries(account_id, holder, smuids, now, deadline,
                                     max_retries)()
    return {int(smuid): (deadline, int(attempts)) for smuid, attempts in won}


def ack_locked_many(account_id: int, held: dict[str, list[int]], wanting: set[int],
                    door: str = "rest") -> tuple[set[tuple[str, int]], list[Published]]:
    """:func:`ack_locked` of several locks of one account (``held``: holder → smuids) in
    one transaction: each is consumed only while its holder holds an unexpired lock on it.
    ``wanting``: the messages that may ask for a receipt (the others are known not to).
    Returns the (holder, smuid) consumed, once committed, and the receipts sent, for the
    caller to announce."""
    now = timezone.now()
    try:
        account = snapshot_for_id(account_id).account.username
    except Account.DoesNotExist:  # deleted: its deliveries went with it
        return set(), []
    with hot_transaction(relaxed=settings.SMQP_ACK_DURABILITY != "full"):
        return _consume(account_id, account, held, wanting, door, now)


def _consume(account_id: int, account: str, held: dict[str, list[int]], wanting: set[int],
             door: str, now: datetime) -> tuple[set[tuple[str, int]], list[Published]]:
    """The heart of :func:`ack_locked_many`, inside the caller's transaction."""
    sent = [(holder, stored.consume_locks(account_id, holder, smuids, now))
            for holder, smuids in held.items() if smuids]
    consumed: set[tuple[str, int]] = set()
    for holder, rows in sent:
        consumed.update((holder, int(smuid)) for smuid, in rows())
    receipts: list[Published] = []
    if consumed:
        done = sorted({smuid for _, smuid in consumed})
        stored.finish_messages(done, now)
        stored.log_events([(UsageEvent.Kind.ACK.value, account, "", smuid, 0, "",
                            {"door": door}) for smuid in done], now)
        asked = [smuid for smuid in done if smuid in wanting]
        if asked:
            receipts = send_receipts(asked, now)
    return consumed, receipts


def settle(takes: list[LockTake], acks: list[LockAck]
           ) -> tuple[list[bool], list[bool], list[Published]]:
    """Many sessions' :func:`lock` and :func:`ack_locked` in one transaction: the queue-mode
    group commit of a listener. Each is decided on its own row's conditions, as by its
    single form, so a batch changes no outcome, only the number of commits. The ACKs go
    first: an item consumed in the batch is not locked again by it. Returns, in order,
    whether each take won its lock and whether each ACK consumed its message (else it is
    the 409 "lock not held"), and the receipts to announce."""
    now = timezone.now()
    names: dict[int, str | None] = {}
    groups: dict[tuple[int, str], dict[str, list[int]]] = {}
    for ack in acks:
        if ack.account_id not in names:
            try:
                names[ack.account_id] = snapshot_for_id(ack.account_id).account.username
            except Account.DoesNotExist:  # deleted: its deliveries went with it
                names[ack.account_id] = None
        if names[ack.account_id] is not None:
            groups.setdefault((ack.account_id, ack.door), {}).setdefault(
                ack.holder, []).append(ack.smuid)
    wanting = {ack.smuid for ack in acks if ack.receipt}
    receipts: list[Published] = []
    consumed: set[tuple[int, str, int]] = set()
    with hot_transaction(relaxed=settings.SMQP_ACK_DURABILITY != "full"):
        for (account_id, door), held in groups.items():
            got, sent = _consume(account_id, names[account_id] or "", held, wanting, door,
                                 now)
            consumed.update((account_id, holder, smuid) for holder, smuid in got)
            receipts += sent
        # One statement per session and policy (a window's takes together), each row
        # still decided on its own conditions; every statement is sent before any result
        # is read: one round trip on PostgreSQL.
        sessions: dict[tuple[int, str, int, int], list[int]] = {}
        for t in takes:
            sessions.setdefault((t.account_id, t.holder, t.retry_timeout, t.max_retries),
                                []).append(t.smuid)
        locking = [(key, stored.lock_deliveries(key[0], key[1], smuids, now,
                                                now + timedelta(seconds=key[2]), key[3]))
                   for key, smuids in sessions.items()]
        won = {(*key, int(smuid)) for key, rows in locking for smuid, _ in rows()}
        took = [(t.account_id, t.holder, t.retry_timeout, t.max_retries, t.smuid) in won
                for t in takes]
    acked = []
    for ack in acks:  # an ACK given twice in one batch consumes once
        key = (ack.account_id, ack.holder, ack.smuid)
        acked.append(key in consumed)
        consumed.discard(key)
    return took, acked, receipts


def ack_locked(account_id: int, session_guid: str, smuid: int,
               receipt: bool = True, door: str = "smqp") -> list[Published]:
    """The ACK of a queue message by the session holding its lock: the delivery is ACKED
    only while this session holds an unexpired lock on it, else 409 and nothing changes.
    Then, as for any ACK (:func:`.ack.ack_batch`, whose durability it shares), the
    message's timeout starts, the usage event is logged and, unless ``receipt`` is False
    (the message is known not to ask for one), a receipt goes to its publisher if asked
    for. Returns the receipts, for the caller to announce (the listener's dispatcher wakes
    them; elsewhere :func:`.notify.messages_committed`)."""
    consumed, receipts = ack_locked_many(account_id, {session_guid: [smuid]},
                                         {smuid} if receipt else set(), door)
    if not consumed:
        raise conflict("lock not held")
    return receipts


def release(account_id: int, session_guid: str, smuids: Iterable[int] | None = None,
            unsent: Iterable[int] = ()) -> list[Published]:
    """The session's locks end before their deadline (all of them, or those on ``smuids``):
    its session ended, or it lets go of them. Each message goes to the next subscribing
    account, or is dead once its attempts are spent. Returns the messages moved, for the
    caller to announce (as :func:`ack_locked`).

    ``unsent``: messages the session locked but never wrote to its transport (it ended
    first). Their locks give back the attempt they counted: nobody received them, and a
    stream dropped while taking items must not spend an item's retries (issue 34 item 1)."""
    held = Delivery.objects.filter(account_id=account_id, state=LOCKED, holder=session_guid)
    if smuids is not None:
        held = held.filter(message_id__in=list(smuids))
    unsent = list(unsent)
    if unsent:
        held.filter(message_id__in=unsent, attempts__gt=0).update(attempts=F("attempts") - 1)
    moved, _ = _end_locks(held, timezone.now(), expired=False)
    return moved


def release_held(account_id: int, holder: str, smuid: int) -> list[Published]:
    """One lock ended by its holder before its deadline (a REST nack): as :func:`release`,
    but only while ``holder`` holds an unexpired lock on the account's delivery of
    ``smuid``; otherwise 409 and nothing changes (an expired lock is the sweep's to end).
    Returns the messages moved, for the caller to announce."""
    now = timezone.now()
    held = Delivery.objects.filter(account_id=account_id, state=LOCKED, holder=holder,
                                   message_id=smuid, next_attempt__gt=now)
    moved, ended = _end_locks(held, now, expired=False)
    if not ended:
        raise conflict("lock not held")
    return moved


def expire_locks(now: datetime | None = None, limit: int = 1000) -> int:
    """Locks whose deadline has passed end (``limit`` at most, earliest first), as with
    :func:`release`; the moved messages are announced to every process. What the holder's
    own listener has not ended already: its process was killed, say. Returns how many
    ended."""
    now = now or timezone.now()
    expired = Delivery.objects.filter(state=LOCKED, next_attempt__lte=now).order_by(
        "next_attempt")[:limit]
    moved, ended = _end_locks(expired, now, expired=True)
    notify.messages_committed(moved)
    return ended


def _end_locks(candidates: QuerySet[Delivery], now: datetime, *,
               expired: bool) -> tuple[list[Published], int]:
    """End the locks of ``candidates`` (read first, then each one ended only if it is still
    the same lock: same holder, still locked, and with ``expired`` still past its deadline).
    Returns the messages moved to another account (or to the same one, the only subscriber),
    and how many locks ended."""
    rows = list(candidates.values_list("pk", "account_id", "message_id", "holder", "attempts",
                                       "message__topic_id", "message__priority"))
    if not rows:
        return [], 0
    tree = topic_tree.tree()
    targets: dict[int, list[int]] = {}
    subs_of: dict[int, list[Sub]] = {}
    moved: list[Published] = []
    dead: list[tuple[int, int]] = []
    finished: list[int] = []
    with transaction.atomic():
        for pk, account_id, smuid, holder, attempts, topic_id, priority in rows:
            same_lock = Delivery.objects.filter(pk=pk, state=LOCKED, holder=holder)
            if expired:
                same_lock = same_lock.filter(next_attempt__lte=now)
            topic = tree.by_id.get(topic_id)
            params = tree.effective(topic) if topic is not None else \
                settings.SMQP_QUEUE_DEFAULTS
            if attempts > int(params["max_retries"] or 0):
                if same_lock.update(state=Delivery.State.DEAD, holder="", next_attempt=None):
                    dead.append((account_id, smuid))
                    finished.append(smuid)
                continue
            if topic is not None and topic.delivery_mode != Topic.DeliveryMode.QUEUE:
                # A fan-out delivery (locked by a REST pull) is this account's own copy:
                # it waits for the same account again.
                if same_lock.update(state=Delivery.State.PENDING, holder="", next_attempt=None):
                    moved.append(Published(smuid, topic_id, topic.path, priority or NO_PRIORITY,
                                           [account_id]))
                continue
            if topic_id not in subs_of:
                subs_of[topic_id] = subscribers([topic], now)().get(topic_id, []) \
                    if topic is not None else []
            if topic is None:
                accounts: list[int] = []
            elif has_selectors(subs_of[topic_id]):  # chosen per message (profile §9.2)
                accounts = receivers(subs_of[topic_id], topic, now, stored_view(smuid))
            else:
                if topic_id not in targets:
                    targets[topic_id] = receivers(subs_of[topic_id], topic, now)
                accounts = targets[topic_id]
            target = next_queue_consumer(accounts, account_id)
            if target is None:
                # Nobody subscribes now: the message waits for the next subscriber
                # (subscribe_backlog gives it one) and its timeout starts, as at a publish
                # with no subscriber.
                if same_lock.delete()[0]:
                    finished.append(smuid)
                continue
            turn = now + timedelta(seconds=int(params["retry_timeout"] or 30))
            if same_lock.update(account_id=target, state=Delivery.State.PENDING, holder="",
                                next_attempt=turn):
                moved.append(Published(smuid, topic_id, topic.path, priority or NO_PRIORITY,
                                       [target]))
        if finished:
            stored.finish_messages(sorted(set(finished)), now)
        if dead:
            UsageEvent.objects.bulk_create([
                UsageEvent(kind=UsageEvent.Kind.DEAD, smuid=m,
                           detail={"account_id": a, "reason": "max retries"})
                for a, m in dead])
    return moved, len(moved) + len(finished)
