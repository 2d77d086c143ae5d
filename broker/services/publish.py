"""PUB MESSAGE / PUB REPLY and REPUBLISH (profile §8).

Two forms of one verb: :func:`publish`, one message in a transaction of its own (what a REST
view calls), and :func:`publish_batch`, a group of publishes in one transaction (what the
listener's group commit calls, in its storage processes: :mod:`.storage_calls`). Each
publish is checked and made a row by :mod:`.prepare`, its receivers found by
:mod:`.deliveries`, and the rows written by the store (:mod:`broker.store.messages`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from broker.domain import message as codec
from broker.models import Delivery, Message, UsageEvent
from broker.store import messages as stored
from broker.store.messages import NewMessage
from broker.store.rows import Inserts, hot_transaction, lock_topics, reads_before_writing
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot, snapshot_for_id

from . import (
    ServiceError,
    bad_request,
    not_acceptable,
    not_found,
    notify,
    qqp_resources,
    too_large,
    unauthorized,
)
from . import topics as topic_service
from .deliveries import (
    NO_PRIORITY,
    effective,
    forwardable,
    has_selectors,
    may_receive,
    pick_queue_consumer,
    receivers,
    selected,
    start_timeouts,
    subscribers,
)
from .freshness import answer_from_fresh_caches, caches_were_stale, is_refusal
from .prepare import PublishRequest, prepare
from .qqp_resources import Redundant
from .selectors import MessageView, message_view, view_of_message

__all__ = [
    "PublishRequest",
    "Published",
    "publish",
    "publish_batch",
    "publish_batch_held",
    "publish_prepared",
    "republish",
]


@dataclass
class Published:
    """What a committed publish produced: the smuid, and who must be told."""

    smuid: int
    topic_id: int
    topic_path: str
    priority: int
    accounts: list[int] = field(default_factory=list)
    # (topic path, Cmuid header, codec message) for NOTIFY, when known without a query.
    payload: tuple[str, str, codec.Message] | None = None


#: A publish that passed its checks: (its index in the batch, its topic, its row).
Prepared = tuple[int, Topic | Node, NewMessage]


def publish(request: PublishRequest) -> Published:
    """One publish in a transaction of its own; raises the ServiceError that refused it.
    Once committed, the subscriber sessions of every process are told
    (:func:`.notify.messages_committed`)."""
    [result] = publish_batch([request])
    if isinstance(result, ServiceError):
        raise result
    notify.messages_committed_on_commit([result])
    return result


def publish_all(requests: list[PublishRequest]) -> list[Published]:
    """Every one of ``requests`` in one transaction, in order, or none of them: the first
    refusal is raised and nothing is stored (a REST batch publish). Once committed, the
    subscriber sessions of every process are told."""
    with transaction.atomic():
        results = publish_batch(requests)
        for result in results:
            if isinstance(result, ServiceError):
                raise result  # rolls the batch back with the atomic block
        # (No Redundant: these requests name no ResourceID.)
        published: list[Published] = results  # type: ignore[assignment]
        notify.messages_committed_on_commit(published)
    return published


def publish_batch(
        requests: list[PublishRequest]) -> list[Published | ServiceError | Redundant]:
    """Store a group of publishes in one transaction. Each request gets its ``Published`` or
    the ServiceError that refused it; the refused ones store nothing. Access is decided from
    the per-process snapshot cache (:func:`ual.resolution.snapshot_for_id`): no permission
    query per message. Rows are written as plain rows (no model instances). The caller
    tells the subscribers (the listener's dispatcher does, for its group commits)."""
    held = publish_batch_held(requests)
    results = next(held)
    next(held, None)  # the COMMIT
    return results


def publish_batch_held(
        requests: list[PublishRequest]) -> Iterator[list[Published | ServiceError | Redundant]]:
    """:func:`publish_batch` in two steps: yields the results once the batch's statements
    are on their way (its transaction open, nothing committed yet); resumed, it commits (and
    raises what the COMMIT raised); closed instead, it rolls back. A storage process holds
    a batch so between the two while the batch before it commits on another connection
    (:mod:`broker.store.lanes`)."""
    now = timezone.now()
    results: list[Published | ServiceError | Redundant | None] = [None] * len(requests)
    with reads_before_writing():
        prepared, publishers = _prepare_all(requests, results, now)
    with hot_transaction():
        claims = _send_claims(requests, prepared, now)
        if claims is not None and _limited(prepared):
            # A queue limit counts only what is stored: the claims are read first.
            prepared = _take_claims(claims, prepared, results, now)
        prepared = _apply_queue_limits(prepared, results)
        _store_batch(requests, prepared, publishers, results, now, claims)
        if claims is not None:
            _settle_claims(claims, results, now)
        yield results  # type: ignore[misc]


@dataclass
class _Claims:
    """A batch's QQP ResourceIDs: the first publish of each key, by key (the one that may be
    stored), the later ones of the same key in the batch (replays: they answer as the first
    does), the claim as sent (read once), and the keys claimed in this transaction."""

    first: dict[tuple[int, str], int]
    repeats: dict[int, int]  # index in the batch → index of the first with its key
    sent: Callable[[], set[tuple[int, str]]]
    claimed: set[tuple[int, str]] | None = None  # None until the claim is read


def _send_claims(requests: list[PublishRequest], prepared: list[Prepared],
                 now: datetime) -> _Claims | None:
    """Claim the ResourceIDs of the batch's QQP items in its transaction (sent now, read by
    :func:`_take_claims` with the batch's other reads); None when it has none."""
    first: dict[tuple[int, str], int] = {}
    repeats: dict[int, int] = {}
    for i, _, _ in prepared:
        rid = requests[i].resource_id
        if rid is None:
            continue
        key = (requests[i].account_id, rid)
        if key in first:
            repeats[i] = first[key]
        else:
            first[key] = i
    if not first:
        return None
    return _Claims(first, repeats, qqp_resources.send_claim(list(first), now))


def _take_claims(claims: _Claims, prepared: list[Prepared], results: list,
                 now: datetime) -> list[Prepared]:
    """Read the claims (:func:`.qqp_resources.claim_in_batch`): an item stored before gets
    its ``Redundant``, a second item of a key in this batch waits for the first's result;
    neither is stored. The publishes still to store."""
    if claims.claimed is not None:
        return prepared
    claims.claimed, stored_before = qqp_resources.claim_in_batch(
        list(claims.first), now, claims.sent)
    for key, smuid in stored_before.items():
        results[claims.first[key]] = qqp_resources.Redundant(smuid)
    return [item for item in prepared
            if item[0] not in claims.repeats and results[item[0]] is None]


def _limited(prepared: list[Prepared]) -> bool:
    """Has a topic of these publishes a queue limit (see :func:`_apply_queue_limits`)?"""
    topics = {item[1].pk: item[1] for item in prepared}.values()
    return any(_queue_limits(topic) != (None, None) for topic in topics)


def _queue_limits(topic: Topic | Node) -> tuple[int | None, int | None]:
    """(max message count, max queue bytes) in effect on the topic; None: no limit."""
    params = effective(topic)
    return params["max_message_count"], params["max_queue_bytes"]


def _settle_claims(claims: _Claims, results: list, now: datetime) -> None:
    """After the batch's rows: each claimed ResourceID gets its item's smuid, or goes (the
    item was refused after all, over a queue limit); replays in the batch answer as their
    first: ``Redundant`` of its smuid, or its refusal."""
    stored: list[tuple[tuple[int, str], int]] = []
    refused: list[tuple[int, str]] = []
    assert claims.claimed is not None  # read before the rows were written
    for key in claims.claimed:
        result = results[claims.first[key]]
        if isinstance(result, Published):
            stored.append((key, result.smuid))
        else:
            refused.append(key)
    qqp_resources.record(stored, now)
    qqp_resources.unclaim(refused)
    for i, j in claims.repeats.items():
        result = results[j]
        results[i] = qqp_resources.Redundant(result.smuid) \
            if isinstance(result, Published) else result


def publish_prepared(items: list[tuple[Topic | Node, NewMessage]], *, publisher: str,
                     guid: str, peer: str = "") -> list[Published | ServiceError]:
    """Store messages whose rows were made elsewhere (a federation link's: the publisher is
    on another server, so no publish right is asked here) as one batch; queue limits apply
    as to any publish. The caller tells the subscribers."""
    now = timezone.now()
    results: list[Published | ServiceError | None] = [None] * len(items)
    requests = [PublishRequest(account_id=0, guid=guid, kind="MESSAGE", topic=topic.path,
                               cmuid=row.cmuid, message=codec.Message([], []), peer=peer,
                               door="federation")
                for topic, row in items]
    prepared: list[Prepared] = [(i, topic, row) for i, (topic, row) in enumerate(items)]
    with hot_transaction():
        prepared = _apply_queue_limits(prepared, results)
        _store_batch(requests, prepared, {0: publisher}, results, now)
    return results  # type: ignore[return-value]


def _prepare_all(requests: list[PublishRequest], results: list,
                 now: datetime) -> tuple[list[Prepared], dict[int, str]]:
    """Check every publish of a batch (refusals go into ``results``): the ones that pass,
    in publish order, and the publishers' names by account id."""
    prepared: list[Prepared] = []
    publishers: dict[int, str] = {}

    def prepare_one(i: int) -> None:
        req = requests[i]
        try:
            snap = snapshot_for_id(req.account_id)
            publishers[req.account_id] = snap.account.username
            topic, row = prepare(snap, req, now)
            prepared.append((i, topic, row))
            results[i] = None
        except ServiceError as exc:
            results[i] = exc
        except (ValueError, KeyError) as exc:
            results[i] = bad_request(str(exc))

    for i in range(len(requests)):
        prepare_one(i)
    refused = [i for i, r in enumerate(results) if is_refusal(r)]
    if refused and caches_were_stale():
        # A refusal is given from fresh caches only (.freshness): prepared again in this
        # batch, in publish order.
        for i in refused:
            prepare_one(i)
        prepared.sort(key=lambda item: item[0])
    return prepared, publishers


def _store_batch(requests: list[PublishRequest], prepared: list[Prepared],
                 publishers: dict[int, str], results: list, now: datetime,
                 claims: _Claims | None = None) -> None:
    """Write the batch's messages, deliveries and usage events; each publish's
    ``Published`` goes into ``results``. ``claims`` not yet read are read with the
    subscriptions (their publishes are among ``prepared`` until then)."""
    topics = {t.pk: t for _, t, _ in prepared}
    lock_topics(topics, exclusive=False)  # a subscription being made: see lock_topics
    # The questions go out before any answer is read (the claims before them): one round
    # trip on PostgreSQL. Keys are asked for every publish; a replay's goes unused.
    subscriptions = subscribers(list(topics.values()), now)
    reserved = stored.MESSAGES.reserve_pks(len(prepared))
    subs = subscriptions()
    if claims is not None:
        prepared = _take_claims(claims, prepared, results, now)
    smuids = _first_keys(reserved, len(prepared))
    allowed_by_topic = {topic_id: receivers(subs.get(topic_id, ()), topic, now)
                        for topic_id, topic in topics.items()}
    # Content-based subscriptions (profile §9.2): only on topics that have some is each
    # message shown to the selectors; elsewhere every message goes to the topic's receivers.
    # Per message too: a Depth 0 message is not for peers (federation links).
    selective = {topic_id for topic_id in topics if has_selectors(subs.get(topic_id, ()))}
    allowed_by_row: dict[int, list[int]] = {}
    for i, topic, row in prepared:
        if topic.pk in selective:
            allowed = receivers(
                subs[topic.pk], topic, now,
                lambda row=row, topic=topic, i=i: _view(row, topic, publishers[
                    requests[i].account_id]))
        else:
            allowed = allowed_by_topic[topic.pk]
        allowed_by_row[i] = forwardable(allowed, row.depth)
    for i, _, row in prepared:
        if not allowed_by_row[i]:
            # Nobody to wait for (or every subscriber selected it out): the timeout starts
            # now, stored with the row (no UPDATE).
            row.expires = stored.expiry(row.timeout, now)
    # The rows of the batch's four tables go out together, as one statement (rows.Inserts).
    inserts = Inserts()
    stored.insert_messages([row for _, _, row in prepared], now, smuids, inserts)
    pairs: list[tuple[int, int]] = []
    for i, topic, row in prepared:
        allowed = allowed_by_row[i]
        if topic.delivery_mode == Topic.DeliveryMode.QUEUE and allowed:
            accounts = [pick_queue_consumer(allowed, row.pk)]
        else:
            accounts = list(allowed)
        pairs.extend((a, row.pk) for a in accounts)
        publisher = publishers[requests[i].account_id]
        cmuid_hdr = f"{publisher}/{requests[i].guid}/{row.cmuid}"
        results[i] = Published(
            smuid=row.pk, topic_id=topic.pk, topic_path=topic.path,
            priority=row.priority or NO_PRIORITY, accounts=accounts,
            payload=(topic.path, cmuid_hdr, codec.Message(list(row.headers), row.sections)))
    stored.insert_deliveries(pairs, now, inserts)
    # detail: the door, and how many deliveries the publish made ("to"), for the reports.
    stored.log_events([(UsageEvent.Kind.PUBLISH, publishers[requests[i].account_id],
                        topic.path, row.pk, row.size, requests[i].peer,
                        {"door": requests[i].door, "to": len(results[i].accounts)})
                       for i, topic, row in prepared], now, inserts)
    inserts.run()


def _first_keys(reserved: Callable[[], list[int]] | None,
                count: int) -> Callable[[], list[int]] | None:
    """The first ``count`` of the keys reserved (ascending: smuids still grow in publish
    order)."""
    if reserved is None or count == 0:
        return None
    return lambda: reserved()[:count]


def _view(row: NewMessage, topic: Topic | Node, publisher: str) -> MessageView:
    """What selectors see of a message being published."""
    return message_view(
        topic=topic.path, publisher=publisher, name=row.name, priority=row.priority,
        created=row.created, timeout=row.timeout, depth=row.depth, sequence=row.sequence,
        headers=row.headers, size=row.size,
        content_type=row.sections[0].content_type if row.sections else None)


def _apply_queue_limits(prepared: list[Prepared], results: list) -> list[Prepared]:
    """Refuse (414) what would take a topic over its max message count or queue bytes."""
    by_topic: dict[int, list[Prepared]] = defaultdict(list)
    for item in prepared:
        by_topic[item[1].pk].append(item)
    kept = []
    for topic_id, items in by_topic.items():
        max_count, max_bytes = _queue_limits(items[0][1])
        if max_count is None and max_bytes is None:
            kept.extend(items)
            continue
        agg = Message.objects.filter(topic_id=topic_id, state=Message.State.PENDING).aggregate(
            n=Count("pk"), b=Sum("size"))
        count, size = agg["n"] or 0, agg["b"] or 0
        for item in items:
            row = item[2]
            if max_count is not None and count + 1 > max_count:
                results[item[0]] = too_large(f"queue holds its maximum of {max_count} messages")
            elif max_bytes is not None and size + row.size > max_bytes:
                results[item[0]] = too_large(f"queue holds its maximum of {max_bytes} bytes")
            else:
                count, size = count + 1, size + row.size
                kept.append(item)
    kept.sort(key=lambda item: item[0])  # keep publish order (smuids grow in arrival order)
    return kept


@answer_from_fresh_caches
def republish_message(snapshot: AccessSnapshot, smuid: int) -> Published:
    """:func:`republish` of the message ``smuid`` wherever it is (the REST door names no
    topic): a message on a topic the account may not see is as missing as one that never
    was (404 message, not 404 topic)."""
    path = Message.objects.filter(pk=smuid).values_list("topic__path", flat=True).first()
    found = topic_service.node(path) if path is not None else None
    if found is None or not snapshot.can_see(found):
        raise not_found("message")
    return republish(snapshot, path, smuid)


@answer_from_fresh_caches
@transaction.atomic
def republish(snapshot: AccessSnapshot, path: str, smuid: int) -> Published:
    """REPUBLISH MESSAGE: bring a message back from Trash to its topic's current
    subscribers. Sequenced and deleted messages cannot be (406). The subscriber sessions of
    every process are told once it commits."""
    base, _ = topic_service.split_trash(path)
    topic = topic_service.visible_node(snapshot, base)
    if not snapshot.allows(topic, Right.PUBLISH):
        raise unauthorized(f"no publish right on {topic.path}")
    real = topic.resolved()
    message = Message.objects.select_for_update().filter(pk=smuid, topic_id=real.pk).first()
    if message is None or message.state == Message.State.DELETED:
        raise not_acceptable("message not found")
    if message.sequence is not None:
        raise not_acceptable("sequenced messages cannot be republished")
    if message.state != Message.State.TRASH:
        raise not_acceptable("message is not in Trash")
    now = timezone.now()
    Delivery.objects.filter(message=message).delete()
    lock_topics([real.pk], exclusive=False)  # as a publish: see lock_topics
    subs = subscribers([real], now)().get(real.pk, [])
    first = message.sections.order_by("position").first()
    allowed = forwardable(may_receive(selected(subs, now, lambda: view_of_message(
        message, topic=real.path,
        publisher=message.publisher.username if message.publisher else None,
        content_type=first.content_type if first is not None else None)), real), message.depth)
    Delivery.objects.bulk_create([Delivery(account_id=a, message=message) for a in allowed])
    Message.objects.filter(pk=message.pk).update(state=Message.State.PENDING, trashed=None,
                                                 expires=None)
    if not allowed:
        start_timeouts([message.pk], now)
    UsageEvent.objects.create(kind=UsageEvent.Kind.REPUBLISH, account=snapshot.account.username,
                              topic=real.path, smuid=message.pk, bytes=message.size)
    published = Published(message.pk, real.pk, real.path, message.priority or NO_PRIORITY,
                          allowed)
    notify.messages_committed_on_commit([published])
    return published
