"""Messages: publish (in groups, one transaction per group), acknowledge, get, republish,
and the sweeps that time decides (expiry, retries, dead letters, trash purge).

The rules of profile §8 live here. The per-process dispatcher (``broker.delivery``) batches
calls to :func:`publish_batch` and :func:`ack_batch`; every function works on lists so that
one transaction serves many messages.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, Sum, Value, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from accounts.models import Account
from broker.domain import message as codec
from broker.domain.values import (
    SmuidSet,
    format_datetime,
    parse_bool,
    parse_datetime,
    parse_int,
    parse_smuid_header,
    parse_timeout,
)
from broker.models import DataSection, Delivery, Message, Subscription, UsageEvent
from broker.store.rows import (
    Inserts,
    Statement,
    Table,
    db_datetime,
    db_json,
    from_db_datetime,
    hot_transaction,
    lock_topics,
    placeholder,
    query,
    raw_cursor,
    server_cursor,
    vendor,
)
from topics import tree as topic_tree
from topics.models import Topic
from topics.tree import Node
from ual import resolution as ual_resolution
from ual.models import Right
from ual.resolution import AccessSnapshot, snapshot_for_id

from . import ServiceError, not_found, unauthorized
from . import topics as topic_service

# Sort key of a message without Priority: after every message that has one.
NO_PRIORITY = 2**31


def too_large(reason: str) -> ServiceError:
    return ServiceError(414, f"Resource too large ({reason})")


# ------------------------------------------------------------------------------- publish


@dataclass
class PublishRequest:
    """One PUB MESSAGE / PUB REPLY as the door received it."""

    account_id: int
    guid: str
    kind: str  # "MESSAGE" or "REPLY"
    topic: str
    cmuid: str
    message: codec.Message
    peer: str = ""


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


def _header(msg: codec.Message, name: str) -> str | None:
    return msg.get(name)


def _effective(topic: Topic | Node) -> dict[str, int | None]:
    """Queue parameters in effect on a topic (from the in-memory tree)."""
    tree = topic_tree.tree()
    found = tree.by_id.get(topic.pk)
    if found is None:  # created in this very transaction: not in any tree yet
        return {name: value for name, (value, _) in Topic.objects.get(
            pk=topic.pk).effective_parameters().items()}
    return tree.effective(found)


def _reply_target(snapshot: AccessSnapshot, req: PublishRequest) -> tuple[Topic, Message | None]:
    """PUB REPLY goes to the original publisher's account topic; the reply right is needed
    on the topic the original message was received from."""
    topic = topic_service.node(req.topic)
    if topic is None or not snapshot.can_see(topic):
        raise not_found("topic")
    if not snapshot.allows(topic, Right.REPLY):
        raise unauthorized(f"no reply right on {topic.path}")
    original = None
    smuid_hdr = req.message.get("Smuid")
    if smuid_hdr:
        _, number = parse_smuid_header(smuid_hdr)
        original = Message.objects.filter(pk=number).select_related("publisher").first()
    account_name = None
    cmuid_hdr = req.message.get("Cmuid")
    if cmuid_hdr:
        account_name = cmuid_hdr.split("/", 1)[0]
    elif original is not None and original.publisher is not None:
        account_name = original.publisher.username
    if not account_name:
        raise not_found("original message")
    target = Topic.objects.filter(account__username_key=account_name.casefold()).first()
    if target is None:
        raise not_found("original publisher")
    return target, original


def _stored_headers(req: PublishRequest, now: datetime) -> list[tuple[str, str]]:
    """The header as stored: as sent, with Created filled in when missing; a reply's Smuid and
    Cmuid (naming the message it answers) are kept as X-Reply-Smuid / X-Reply-Cmuid."""
    headers: list[tuple[str, str]] = []
    for name, value in req.message.headers:
        if name == "Smuid":
            headers.append(("X-Reply-Smuid", value))
        elif name == "Cmuid":
            headers.append(("X-Reply-Cmuid", value))
        else:
            headers.append((name, value))
    if req.message.get("Created") is None:
        headers.insert(0, ("Created", format_datetime(now)))
    return headers


@dataclass(slots=True)
class _NewMessage:
    """A message about to be stored: its column values, without a model instance."""

    topic_id: int
    publisher_id: int | None
    publisher_guid: str
    cmuid: str
    name: str
    priority: int | None
    created: datetime
    timeout: int | None
    depth: int
    sequence: int | None
    receipt: bool
    reply: bool
    in_reply_to_id: int | None
    headers: list[tuple[str, str]]
    size: int
    sections: list[codec.DataSection]
    expires: datetime | None = None
    pk: int = 0


_MESSAGES = Table(Message, (
    "topic", "publisher", "publisher_guid", "cmuid", "name", "priority", "created", "received",
    "timeout", "expires", "depth", "sequence", "receipt", "reply", "in_reply_to", "headers",
    "size", "state", "trashed"))
_SECTIONS = Table(DataSection, (
    "message", "position", "content_type", "content_length", "content_encoding", "headers",
    "body"))
_DELIVERIES = Table(Delivery, (
    "account", "message", "state", "attempts", "created", "last_attempt", "next_attempt",
    "acked"))
_EVENTS = Table(UsageEvent, (
    "at", "kind", "account", "topic", "smuid", "bytes", "peer", "detail"))


def _prepare(snapshot: AccessSnapshot, req: PublishRequest,
             now: datetime) -> tuple[Topic | Node, _NewMessage]:
    msg = req.message
    original = None
    if req.kind == "REPLY":
        topic, original = _reply_target(snapshot, req)
    else:
        found = topic_service.node(req.topic)
        if found is None or found.state != Topic.State.ACTIVE or not snapshot.can_see(found):
            raise not_found("topic")
        topic = found.resolved()
        if topic.state != Topic.State.ACTIVE:
            raise not_found("topic")
        if not snapshot.allows(found, Right.PUBLISH):
            raise unauthorized(f"no publish right on {found.path}")
    params = _effective(topic)
    size = sum(len(s.body) for s in msg.sections)
    limit = params["max_message_size"]
    if limit is not None and size > limit:
        raise too_large(f"message of {size} bytes; {topic.path} takes at most {limit}")
    timeout_hdr = msg.get("Timeout")
    timeout = parse_timeout(timeout_hdr) if timeout_hdr else params["expiry_timeout"]
    priority = msg.get("Priority")
    sequence = msg.get("Sequence")
    created = msg.get("Created")
    row = _NewMessage(
        topic_id=topic.pk,
        publisher_id=req.account_id,
        publisher_guid=req.guid,
        cmuid=req.cmuid[:200],
        name=(msg.get("Name") or "")[:128],
        priority=parse_int(priority, minimum=1) if priority else None,
        created=parse_datetime(created) if created else now,
        timeout=timeout,
        depth=parse_int(msg.get("Depth") or "0", minimum=-1),
        sequence=parse_int(sequence, minimum=1) if sequence else None,
        receipt=parse_bool(msg.get("Receipt") or "NO"),
        reply=parse_bool(msg.get("Reply") or "NO"),
        in_reply_to_id=original.pk if original is not None else None,
        headers=_stored_headers(req, now),
        size=size,
        sections=msg.sections,
    )
    return topic, row


def _store(rows: list[_NewMessage], now: datetime,
           reserved: Callable[[], list[int]] | None = None,
           into: Inserts | None = None) -> None:
    """INSERT the messages and their data sections (now, or with ``into``); sets each row's
    ``pk`` (its smuid). ``reserved``: their keys, asked for already
    (:meth:`.rows.Table.reserve_pks`)."""
    pending = Message.State.PENDING.value
    # Most rows share their datetimes (the batch's ``now``, the expiry a topic's timeout
    # gives): each is converted once.
    converted: dict[datetime | None, object] = {None: None, now: db_datetime(now)}

    def when(value: datetime | None) -> object:
        found = converted.get(value, converted)
        if found is converted:
            found = converted[value] = db_datetime(value)
        return found

    received = converted[now]
    pks = _MESSAGES.insert_returning_pks([
        (r.topic_id, r.publisher_id, r.publisher_guid, r.cmuid, r.name, r.priority,
         when(r.created), received, r.timeout, when(r.expires), r.depth,
         r.sequence, r.receipt, r.reply, r.in_reply_to_id, db_json(r.headers), r.size,
         pending, None)
        for r in rows], reserved, into)
    sections = []
    for row, pk in zip(rows, pks, strict=True):
        row.pk = pk
        for i, s in enumerate(row.sections):
            sections.append((pk, i, (s.content_type or "")[:255], len(s.body),
                             (s.get("Content-Encoding") or "")[:255],
                             _headers_json(s.headers), s.body))
    _SECTIONS.insert(sections, into)


#: A data header as stored (JSON text) → reused: a publisher's sections mostly carry the
#: same few data headers (``Content-Type: ...``). Bounded: the values are the client's.
_HEADERS_JSON: dict[tuple[tuple[str, str], ...], str] = {}
_HEADERS_JSON_MAX = 1024


def _headers_json(headers: list[tuple[str, str]]) -> str:
    key = tuple(map(tuple, headers))
    text = _HEADERS_JSON.get(key)  # type: ignore[arg-type]
    if text is None:
        text = db_json([list(h) for h in headers])
        if len(_HEADERS_JSON) < _HEADERS_JSON_MAX and len(text) <= 256:
            _HEADERS_JSON[key] = text  # type: ignore[index]
    return text


def _insert_deliveries(pairs: list[tuple[int, int]], now: datetime,
                       into: Inserts | None = None) -> None:
    """New pending Delivery rows for (account, smuid) pairs (now, or with ``into``)."""
    at = db_datetime(now)
    pending = Delivery.State.PENDING.value
    _DELIVERIES.insert([(a, m, pending, 0, at, None, None, None) for a, m in pairs], into)


Event = tuple[str, str, str, int | None, int, str, dict]


def _log_events(events: list[Event], now: datetime, into: Inserts | None = None) -> None:
    """Append usage events: (kind, account, topic, smuid, bytes, peer, detail) (now, or with
    ``into``)."""
    _EVENTS.insert(_event_rows(events, now), into)


def _event_rows(events: list[Event], now: datetime) -> list[tuple]:
    """The rows of :func:`_log_events` (for :data:`_EVENTS`)."""
    at = db_datetime(now)
    return [(at, kind, account, topic, smuid, size, peer,
             db_json(detail) if detail else "{}")
            for kind, account, topic, smuid, size, peer, detail in events]


def _subscribers(topics: list[Topic | Node],
                 now: datetime) -> Callable[[], dict[int, list[tuple[int, datetime | None]]]]:
    """For each topic id: the (account, since) of MESSAGE subscriptions covering it, by its
    own name or the name of a virtual topic linking to it. The query is sent at once; the
    returned function reads its answer (see :func:`.rows.query`)."""
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
    ph = placeholder()
    rows = query(  # once per publish batch: plain SQL
        f"SELECT pattern_key, account_id, since FROM {Subscription._meta.db_table} "
        f"WHERE resource = {ph} AND pattern_key IN ({', '.join([ph] * len(wanted))})",
        [Subscription.Resource.MESSAGE.value, *wanted])

    def read() -> dict[int, list[tuple[int, datetime | None]]]:
        result: dict[int, list[tuple[int, datetime | None]]] = defaultdict(list)
        for key, account_id, since in rows():
            for topic_id in wanted[key]:
                result[topic_id].append((account_id, from_db_datetime(since)))
        return result

    return read


#: Refusals that may come from caches a moment behind another process's change: given only
#: once :func:`caches_were_stale` says the caches were current.
REFUSALS = (401, 404)


def caches_were_stale() -> bool:
    """Had this process's topic tree or access snapshots missed a change made elsewhere?
    Both shared change counters are read now (not at the next poll); stale caches are
    dropped, so the next use reads the database."""
    trees = topic_tree.recheck()
    return ual_resolution.recheck() or trees


def publish_batch(requests: list[PublishRequest]) -> list[Published | ServiceError]:
    """Store a group of publishes in one transaction. Each request gets its ``Published`` or
    the ServiceError that refused it; the refused ones store nothing. Access is decided from
    the per-process snapshot cache (:func:`ual.resolution.snapshot_for_id`): no permission
    query per message. Rows are written through :mod:`.rows` (no model instances)."""
    held = publish_batch_held(requests)
    results = next(held)
    next(held, None)  # the COMMIT
    return results


def publish_batch_held(
        requests: list[PublishRequest]) -> Iterator[list[Published | ServiceError]]:
    """:func:`publish_batch` in two steps: yields the results once the batch's statements
    are on their way (its transaction open, nothing committed yet); resumed, it commits (and
    raises what the COMMIT raised); closed instead, it rolls back. A storage process holds
    a batch so between the two while the batch before it commits on another connection
    (:mod:`broker.store.storage`)."""
    now = timezone.now()
    results: list[Published | ServiceError | None] = [None] * len(requests)
    prepared: list[tuple[int, Topic | Node, _NewMessage]] = []
    publishers: dict[int, str] = {}

    def prepare(i: int) -> None:
        req = requests[i]
        try:
            snap = snapshot_for_id(req.account_id)
            publishers[req.account_id] = snap.account.username
            topic, row = _prepare(snap, req, now)
            prepared.append((i, topic, row))
            results[i] = None
        except ServiceError as exc:
            results[i] = exc
        except (ValueError, KeyError) as exc:
            results[i] = ServiceError(400, f"Bad request ({exc})")

    for i in range(len(requests)):
        prepare(i)
    refused = [i for i, r in enumerate(results)
               if isinstance(r, ServiceError) and r.code in REFUSALS]
    if refused and caches_were_stale():
        # The topic or the right may be a moment old, made by another process: a refusal is
        # given from fresh caches only. Prepared again in this batch, in publish order.
        for i in refused:
            prepare(i)
        prepared.sort(key=lambda item: item[0])
    with hot_transaction():
        prepared = _apply_queue_limits(prepared, results)
        topics = {t.pk: t for _, t, _ in prepared}
        lock_topics(topics, exclusive=False)  # a subscription being made: see lock_topics
        # Both questions go out before either answer is read: one round trip on PostgreSQL.
        subscribers = _subscribers(list(topics.values()), now)
        smuids = _MESSAGES.reserve_pks(len(prepared))
        subs = subscribers()
        allowed_by_topic = {topic_id: _receivers(subs.get(topic_id, ()), topic, now)
                            for topic_id, topic in topics.items()}
        for _, topic, row in prepared:
            if not allowed_by_topic[topic.pk]:
                # Nobody to wait for: the timeout starts now, stored with the row (no UPDATE).
                row.expires = _expiry(row.timeout, now)
        # The rows of the batch's four tables go out together, as one statement (rows.Inserts).
        inserts = Inserts()
        _store([row for _, _, row in prepared], now, smuids, inserts)
        deliveries: list[tuple[int, int]] = []
        for i, topic, row in prepared:
            allowed = allowed_by_topic[topic.pk]
            if topic.delivery_mode == Topic.DeliveryMode.QUEUE and allowed:
                accounts = [_pick_queue_consumer(topic, allowed, row.pk)]
            else:
                accounts = list(allowed)
            deliveries.extend((a, row.pk) for a in accounts)
            publisher = publishers[requests[i].account_id]
            cmuid_hdr = f"{publisher}/{requests[i].guid}/{row.cmuid}"
            results[i] = Published(
                smuid=row.pk, topic_id=topic.pk, topic_path=topic.path,
                priority=row.priority or NO_PRIORITY, accounts=accounts,
                payload=(topic.path, cmuid_hdr, codec.Message(list(row.headers), row.sections)))
        _insert_deliveries(deliveries, now, inserts)
        _log_events([(UsageEvent.Kind.PUBLISH, publishers[requests[i].account_id], topic.path,
                      row.pk, row.size, requests[i].peer, {}) for i, topic, row in prepared],
                     now, inserts)
        inserts.run()
        yield results  # type: ignore[misc]


def _apply_queue_limits(prepared, results):
    """Refuse (414) what would take a topic over its max message count or queue bytes."""
    by_topic: dict[int, list] = defaultdict(list)
    for item in prepared:
        by_topic[item[1].pk].append(item)
    kept = []
    for topic_id, items in by_topic.items():
        params = _effective(items[0][1])
        max_count, max_bytes = params["max_message_count"], params["max_queue_bytes"]
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


def _receivers(subscriptions: Iterable[tuple[int, datetime | None]], topic: Topic,
               now: datetime) -> list[int]:
    """The accounts to deliver a message of ``topic`` published ``now`` to, from the
    (account, since) of the subscriptions covering it (:func:`_subscribers`): those whose
    since-time has come and that may (still) receive from it, ascending."""
    return _may_receive([a for a, since in subscriptions if since is None or since <= now],
                        topic)


def _may_receive(account_ids: list[int], topic: Topic) -> list[int]:
    """The accounts among ``account_ids`` that may (still) subscribe to ``topic``, from the
    cached access snapshots (a deleted or disabled account may not)."""
    return sorted({a for a in account_ids if snapshot_for_id(a).allows(topic, Right.SUBSCRIBE)})


def _pick_queue_consumer(topic: Topic, accounts: list[int], smuid: int) -> int:
    """Queue mode: each message to exactly one subscribing account, in turn."""
    return accounts[smuid % len(accounts)]


def _start_timeouts(message_ids: list[int], now: datetime) -> None:
    """The timeout of these messages starts now: set their expiry (none for state
    messages, whose timeout is negative)."""
    if message_ids:
        _start_timeouts_known(
            list(Message.objects.filter(pk__in=message_ids).values_list("pk", "timeout")), now)


def _expiry(timeout: int | None, now: datetime) -> datetime | None:
    """When a message whose timeout starts ``now`` expires: never for a state message
    (negative timeout) or one without a timeout."""
    if timeout is None or timeout < 0:
        return None
    return now + timedelta(seconds=timeout)


def _start_timeouts_known(messages: list[tuple[int, int | None]], now: datetime) -> None:
    """:func:`_start_timeouts` for (smuid, timeout) pairs already known."""
    groups: dict[datetime, list[int]] = defaultdict(list)
    for pk, timeout in messages:
        expires = _expiry(timeout, now)
        if expires is not None:
            groups[expires].append(pk)
    if not groups:
        return
    ph = placeholder()
    with raw_cursor() as cursor:
        for expires, ids in groups.items():
            cursor.execute(
                f"UPDATE {Message._meta.db_table} SET expires = {ph} "
                f"WHERE id IN ({', '.join([ph] * len(ids))}) AND expires IS NULL",
                [db_datetime(expires), *ids])


# ----------------------------------------------------------------------------------- ack


@dataclass
class AckRequest:
    account_id: int
    smuid: int
    attempts: int = 1
    # False when the message is known not to ask for a receipt (:func:`may_want_receipt`):
    # the ACK then needs nothing read back before its COMMIT.
    receipt: bool = True


def may_want_receipt(message: codec.Message) -> bool:
    """Might a first ACK of this (stored) message owe its publisher a receipt? Its
    ``Receipt`` header, read as the publish read it (an unreadable one: maybe)."""
    try:
        return parse_bool(message.get("Receipt") or "NO")
    except ValueError:
        return True


def ack_batch(acks: list[AckRequest]) -> list[Published]:
    """Record ACKs in one transaction: the deliveries become ACKed (once per account, ever);
    messages whose every publish-time subscriber has now ACKed start their timeout; a
    receipt goes to the publisher at the first ACK when asked for. Returns the receipts,
    for the caller to offer once this has returned (committed). Plain SQL, a handful of
    statements per batch; on PostgreSQL one round trip when no message of the batch asks
    for a receipt, else two: this runs once per NOTIFY round trip."""
    # An ACK recorded in a listener's journal reaches this later, and is applied until it
    # commits: one of an account deleted since (its deliveries went with it) is moot, and
    # must not fail its batch again and again.
    names: dict[int, str] = {}
    for account_id in {ack.account_id for ack in acks}:
        with contextlib.suppress(Account.DoesNotExist):
            names[account_id] = snapshot_for_id(account_id).account.username
    acks = [ack for ack in acks if ack.account_id in names]
    if not acks:
        return []
    now = timezone.now()
    smuids = sorted({ack.smuid for ack in acks})
    kind = UsageEvent.Kind.ACK.value
    events = _event_rows([(kind, names[a.account_id], "", a.smuid, 0, "", {}) for a in acks],
                         now)
    relaxed = settings.SMQP_ACK_DURABILITY != "full"
    receipts = any(ack.receipt for ack in acks)
    if vendor() == "postgresql" and not receipts:
        # Nothing to read back: one pipeline of three statements whatever the batch's size
        # (one upsert per ACK, parsed and planned each, was most of the server's work).
        with hot_transaction(relaxed=relaxed):
            _upsert_acked(acks, now)
            _execute_all(_finish_statements(smuids, now))
            _EVENTS.insert(events)
        return []
    # One statement per ACK (rows read back for receipts; SQLite has no arrays).
    ph = placeholder()
    upsert = _acked_upsert(f"SELECT {ph}, id, {ph}, {ph}, {ph}, {ph}, NULL, {ph} "
                           f"FROM {Message._meta.db_table} WHERE id = {ph} AND EXISTS "
                           f"(SELECT 1 FROM {Account._meta.db_table} WHERE id = {ph})")
    at = db_datetime(now)
    acked = Delivery.State.ACKED.value
    params = [(ack.account_id, acked, ack.attempts, at, at, at, ack.smuid, ack.account_id)
              for ack in acks]
    woken: list[Published] = []
    with hot_transaction(relaxed=relaxed):
        if receipts:
            firsts = [(ack.smuid, query(upsert + " RETURNING message_id", p))
                      for ack, p in zip(acks, params, strict=True)]
        else:
            with raw_cursor() as cursor:
                cursor.executemany(upsert, params)
        finish_messages(smuids, now)
        if receipts:
            newly = [smuid for smuid, rows in firsts if rows()]
            woken = _send_receipts(newly, now) if newly else []
        _EVENTS.insert(events)
    return woken


def _acked_upsert(select: str) -> str:
    """The ACK's upsert, its rows from ``select`` (account, message, state, attempts,
    created, last_attempt, next_attempt, acked): the delivery row becomes ACKed, or is
    created ACKed (a subscriber that arrived later got the message from the backlog, with
    no row yet). A row ACKed before stays as it is and is not returned: only first ACKs
    come back. The select gives no row for an account deleted after its snapshot was
    cached (see :func:`ack_batch`)."""
    return (f"INSERT INTO {Delivery._meta.db_table} AS d (account_id, message_id, state, "
            f"attempts, created, last_attempt, next_attempt, acked) {select} "
            f"ON CONFLICT (account_id, message_id) DO UPDATE SET state = excluded.state, "
            f"acked = excluded.acked, last_attempt = excluded.last_attempt "
            f"WHERE d.state <> excluded.state")


def _upsert_acked(acks: list[AckRequest], now: datetime) -> None:
    """PostgreSQL, one statement for a batch (:func:`_acked_upsert` over arrays), the first
    ACK of each (account, smuid) pair only (a pair twice in one statement would be an
    error)."""
    firsts: dict[tuple[int, int], int] = {}
    for ack in acks:
        firsts.setdefault((ack.account_id, ack.smuid), ack.attempts)
    with server_cursor() as cursor:
        cursor.execute(
            _acked_upsert(
                f"SELECT a.account_id, m.id, %s, a.attempts, %s, %s, NULL, %s "
                f"FROM unnest(%s::bigint[], %s::bigint[], %s::integer[]) "
                f"AS a(account_id, message_id, attempts) "
                f"JOIN {Message._meta.db_table} m ON m.id = a.message_id "
                f"WHERE EXISTS (SELECT 1 FROM {Account._meta.db_table} "
                f"WHERE id = a.account_id)"),
            [Delivery.State.ACKED.value, now, now, now, [a for a, _ in firsts],
             [m for _, m in firsts], list(firsts.values())],
            prepare=False)  # a join: see _execute_all


def _execute_all(statements: list[Statement]) -> None:
    """PostgreSQL: run statements with server-side binding, each planned for its values,
    never prepared (where the storage processes prepare: broker.store.storage). A statement that
    finds rows may get a generic plan that reads far more of them than the plan made for
    its arrays, while the tables' statistics are young and they grow: prepared, an UPDATE
    that finishes an ACK batch (``m.id = ANY($n)`` among other conditions) took 5.3 ms a
    batch instead of 0.4 in the latency scenario, the ACK upsert (a join) 1.2 ms instead of
    0.5.
    Only the INSERTs over arrays (:class:`~broker.store.rows.Table`) are prepared."""
    with server_cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params, prepare=False)


def finish_messages(message_ids: list[int], now: datetime) -> None:
    """Messages with no delivery still open start their timeout; those with dead
    deliveries and none open go to Trash (for audit) at once.

    PostgreSQL: two UPDATEs that decide it themselves, so nothing is read back (inside
    :func:`.rows.hot_transaction` they leave with the COMMIT). SQLite (no round trips to
    save): the facts are read, and the datetimes computed here, in the form Django writes."""
    if not message_ids:
        return
    if vendor() == "postgresql":
        _execute_all(_finish_statements(message_ids, now))
        return
    marks = ", ".join([placeholder()] * len(message_ids))
    ph = placeholder()
    # Each message once, with the states of its deliveries that are not ACKed (if any).
    rows = query(
        f"SELECT m.id, m.timeout, d.state FROM {Message._meta.db_table} m "
        f"LEFT JOIN {Delivery._meta.db_table} d ON d.message_id = m.id AND d.state <> {ph} "
        f"WHERE m.id IN ({marks})", [Delivery.State.ACKED.value, *message_ids])
    timeouts: dict[int, int | None] = {}
    open_ids: set[int] = set()
    dead: set[int] = set()
    for smuid, timeout, state in rows():
        timeouts[smuid] = timeout
        if state is not None:
            (dead if state == Delivery.State.DEAD else open_ids).add(smuid)
    done = [m for m in message_ids if m in timeouts and m not in open_ids]
    trash = [m for m in done if m in dead]
    if trash:
        Message.objects.filter(pk__in=trash, state=Message.State.PENDING).update(
            state=Message.State.TRASH, trashed=now)
    _start_timeouts_known([(m, timeouts[m]) for m in done if m not in dead], now)


def _finish_statements(message_ids: list[int], now: datetime) -> list[Statement]:
    """:func:`finish_messages` on PostgreSQL: the same rule as one UPDATE that reads nothing
    back. Each message's deliveries are looked at once (open: neither ACKed nor dead; dead),
    then a message open for no one goes to Trash if it is dead for someone (and still
    waiting), else its timeout starts (none for a state message or no timeout). Two UPDATEs,
    one for each case, looked at the deliveries twice: the Trash one, which almost never
    changes a row, cost PostgreSQL 5% of its time in the e2e benchmark.

    The batch's ids are the only condition on the message an index may serve: the others
    are ``IS TRUE`` tests, which no index matches, so the plan reads these messages by their
    primary key whatever the statistics say. With ``m.state = 'pending'`` as a plain
    condition, statistics taken while few messages waited (or none: a young table, or no
    autovacuum) made the planner read every waiting message through the topic index and
    filter the ids out of them, 5-9 ms an ACK batch instead of about 0.3."""
    messages, deliveries = Message._meta.db_table, Delivery._meta.db_table
    acked, dead = Delivery.State.ACKED.value, Delivery.State.DEAD.value
    return [(
        f"UPDATE {messages} m "
        f"SET state = CASE WHEN f.dead THEN %s ELSE m.state END, "
        f"trashed = CASE WHEN f.dead THEN %s ELSE m.trashed END, "
        f"expires = CASE WHEN f.dead THEN m.expires "
        f"ELSE %s + m.timeout * interval '1 second' END "
        # LATERAL: the deliveries of each message found by their index, one message after
        # another, whatever the statistics say (a join grouped afterwards was planned as a
        # scan of every delivery while the table was young). None at all: neither open nor
        # dead.
        f"FROM unnest(%s::bigint[]) AS u(id) CROSS JOIN LATERAL ("
        f"SELECT bool_or(d.state = %s) IS TRUE AS dead, "
        f"bool_or(d.state NOT IN (%s, %s)) IS TRUE AS open "
        f"FROM {deliveries} d WHERE d.message_id = u.id) f "
        f"WHERE m.id = ANY(%s) AND m.id = u.id AND NOT f.open "
        f"AND CASE WHEN f.dead THEN (m.state = %s) IS TRUE "
        f"ELSE (m.expires IS NULL AND m.timeout >= 0) IS TRUE END",
        [Message.State.TRASH.value, now, now, message_ids, dead, acked, dead, message_ids,
         Message.State.PENDING.value],
    )]


def _send_receipts(message_ids: list[int], now: datetime) -> list[Published]:
    """Receipt: YES → at the first ACK, a receipt message on the publisher's account topic.
    Returns the receipts stored, to be offered to their subscribers after the commit."""
    stored: list[Published] = []
    wanting = Message.objects.filter(pk__in=message_ids, receipt=True).select_related(
        "publisher", "topic")
    due: list[tuple[Message, Topic]] = []
    for original in wanting:
        acked = Delivery.objects.filter(message=original, state=Delivery.State.ACKED).count()
        if acked != 1 or original.publisher is None:  # only the first ACK sends one
            continue
        target = Topic.objects.filter(account=original.publisher).first()
        if target is not None:
            due.append((original, target))
    # As a publish (see lock_topics), all at once: taken one by one, in no set order, they
    # could deadlock with a subscription locking two of these topics.
    lock_topics([target.pk for _, target in due], exclusive=False)
    for original, target in due:
        host = settings.SMQP_SERVER_CONTEXT
        body = f"delivered {host}/{original.pk} on {original.topic.path}".encode()
        receipt = Message.objects.create(
            topic=target, publisher=None, cmuid=f"receipt-{original.pk}", name="Receipt",
            created=now, received=now, timeout=_effective(target)["expiry_timeout"],
            in_reply_to=original, size=len(body),
            headers=[("Created", format_datetime(now)), ("Name", "Receipt"),
                     ("X-Receipt-Smuid", f"{host}/{original.pk}"),
                     ("X-Receipt-Cmuid", original.cmuid)],
        )
        DataSection.objects.create(message=receipt, position=0, content_type="text/plain",
                                   content_length=len(body), headers=[["Content-Type",
                                                                       "text/plain"]],
                                   body=body)
        receivers = _subscribers([target], now)().get(target.pk, [])
        Delivery.objects.bulk_create([Delivery(account_id=a, message=receipt)
                                      for a, _ in receivers])
        if not receivers:
            _start_timeouts([receipt.pk], now)
        stored.append(Published(receipt.pk, target.pk, target.path, NO_PRIORITY,
                                [a for a, _ in receivers]))
    return stored


def retry_policy(topic_path: str) -> tuple[int, int]:
    """(retry timeout in seconds, max retries) in effect on a topic."""
    topic = topic_service.node(topic_path)
    params = _effective(topic.resolved()) if topic else settings.SMQP_QUEUE_DEFAULTS
    return int(params["retry_timeout"] or 30), int(params["max_retries"] or 0)


def mark_dead(pairs: list[tuple[int, int]], reason: str = "max retries") -> None:
    """These (account, smuid) deliveries are dead for that account: they used up their
    retries, or (``reason``) may no longer be delivered."""
    now = timezone.now()
    with transaction.atomic():
        for account_id, smuid in pairs:
            updated = Delivery.objects.filter(account_id=account_id, message_id=smuid).exclude(
                state=Delivery.State.ACKED).update(state=Delivery.State.DEAD, last_attempt=now)
            if not updated and not Delivery.objects.filter(
                    account_id=account_id, message_id=smuid).exists():
                Delivery.objects.create(account_id=account_id, message_id=smuid,
                                        state=Delivery.State.DEAD, last_attempt=now)
        finish_messages(sorted({m for _, m in pairs}), now)
        UsageEvent.objects.bulk_create([
            UsageEvent(kind=UsageEvent.Kind.DEAD, smuid=m,
                       detail={"account_id": a, "reason": reason})
            for a, m in pairs])


def deliverable(account_id: int, smuid: int) -> bool:
    """May this message still be sent to this account? Its subscribe right on the message's
    topic may have been revoked since the delivery was recorded (at publish, or in a backlog).

    When it may not, the delivery is withdrawn: on a fan-out topic it is dead for that account
    (so the message's timeout is not held up by it; Trash for audit once nobody else waits);
    in queue mode it is left to :func:`requeue_stale_queue_deliveries`, which hands it to a
    subscriber that may still receive it."""
    topic_id = Message.objects.filter(pk=smuid).values_list("topic_id", flat=True).first()
    if topic_id is None:
        return False
    topic = topic_tree.tree().by_id.get(topic_id)
    if topic is not None and snapshot_for_id(account_id).allows(topic, Right.SUBSCRIBE):
        return True
    if topic is None or topic.delivery_mode != Topic.DeliveryMode.QUEUE:
        mark_dead([(account_id, smuid)], reason="subscribe right revoked")
    return False


# ------------------------------------------------------------------------- reading messages


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
    waiting = Delivery.objects.filter(
        account_id__in=account_ids,
        state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED],
        message__state=Message.State.PENDING,
    ).filter(Q(message__expires__isnull=True) | Q(message__expires__gt=now))
    if len(account_ids) > 1:
        waiting = waiting.annotate(rank=Window(RowNumber(), partition_by=[F("account_id")],
                                               order_by=order)).filter(rank__lte=limit)
    else:
        waiting = waiting.order_by(*order)[:limit]
    rows = waiting.values_list("account_id", "message__priority", "message_id")
    return sorted((a, p or NO_PRIORITY, m) for a, p, m in rows)


def subscribe_backlog(account_id: int, topics: list[Topic | Node],
                      since: datetime | None) -> int:
    """A new MESSAGE subscription: messages still held on these topics (published after
    ``since``, not expired) that the account never got become pending deliveries for it,
    however many there are (one INSERT ... SELECT; the session reads them page by page).
    On a topic in delivery mode ``queue`` only messages no subscriber holds yet: each
    message goes to one subscriber. Returns how many deliveries were added."""
    now = timezone.now()
    by_mode: dict[bool, set[int]] = defaultdict(set)
    for topic in topics:
        target = topic.resolved()
        by_mode[target.delivery_mode == Topic.DeliveryMode.QUEUE].add(target.pk)
    # A publish batch under way on these topics commits first, or sees this subscription.
    lock_topics(by_mode[False] | by_mode[True], exclusive=True)
    ph = placeholder()
    deliveries, messages = Delivery._meta.db_table, Message._meta.db_table
    added = 0
    with raw_cursor() as cursor:
        for queue, topic_ids in by_mode.items():
            if not topic_ids:
                continue
            held_by = "" if queue else f"AND d.account_id = {ph} "
            params: list = [account_id, Delivery.State.PENDING.value, db_datetime(now),
                            *sorted(topic_ids), Message.State.PENDING.value, db_datetime(now)]
            received = ""
            if since is not None:
                received = f"AND m.received >= {ph} "
                params.append(db_datetime(since))
            if not queue:
                params.append(account_id)
            cursor.execute(
                f"INSERT INTO {deliveries} (account_id, message_id, state, attempts, created, "
                f"last_attempt, next_attempt, acked) "
                f"SELECT {ph}, m.id, {ph}, 0, {ph}, NULL, NULL, NULL FROM {messages} m "
                f"WHERE m.topic_id IN ({', '.join([ph] * len(topic_ids))}) AND m.state = {ph} "
                f"AND (m.expires IS NULL OR m.expires > {ph}) {received}"
                f"AND NOT EXISTS (SELECT 1 FROM {deliveries} d WHERE d.message_id = m.id "
                f"{held_by}) ORDER BY m.id ON CONFLICT DO NOTHING", params)
            added += max(cursor.rowcount, 0)
    return added


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
    qs = Message.objects.filter(topic_id=real.pk).exclude(state=Message.State.DELETED)
    qs = qs.filter(state=Message.State.TRASH) if trash else qs
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


@transaction.atomic
def republish(snapshot: AccessSnapshot, path: str, smuid: int) -> Published:
    """REPUBLISH MESSAGE: bring a message back from Trash to its topic's current
    subscribers. Sequenced and deleted messages cannot be (406)."""
    base, _ = topic_service.split_trash(path)
    topic = topic_service.visible_node(snapshot, base)
    if not snapshot.allows(topic, Right.PUBLISH):
        raise unauthorized(f"no publish right on {topic.path}")
    real = topic.resolved()
    message = Message.objects.select_for_update().filter(pk=smuid, topic_id=real.pk).first()
    if message is None or message.state == Message.State.DELETED:
        raise ServiceError(406, "Not acceptable (message not found)")
    if message.sequence is not None:
        raise ServiceError(406, "Not acceptable (sequenced messages cannot be republished)")
    if message.state != Message.State.TRASH:
        raise ServiceError(406, "Not acceptable (message is not in Trash)")
    now = timezone.now()
    Delivery.objects.filter(message=message).delete()
    lock_topics([real.pk], exclusive=False)  # as a publish: see lock_topics
    subs = _subscribers([real], now)().get(real.pk, [])
    allowed = _may_receive([a for a, _ in subs], real)
    Delivery.objects.bulk_create([Delivery(account_id=a, message=message) for a in allowed])
    Message.objects.filter(pk=message.pk).update(state=Message.State.PENDING, trashed=None,
                                                 expires=None)
    if not allowed:
        _start_timeouts([message.pk], now)
    UsageEvent.objects.create(kind=UsageEvent.Kind.REPUBLISH, account=snapshot.account.username,
                              topic=real.path, smuid=message.pk, bytes=message.size)
    return Published(message.pk, real.pk, real.path, message.priority or NO_PRIORITY, allowed)


# ----------------------------------------------------------------------------- sweeps


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


def requeue_stale_queue_deliveries(now: datetime | None = None) -> int:
    """Queue mode: a message not ACKed within its topic's retry timeout goes to the next
    subscribing account; after the topic's max retries it is dead (Trash, for audit).
    Returns how many deliveries moved or died."""
    now = now or timezone.now()
    tree = topic_tree.tree()
    queue_topics = [n for n in tree.by_id.values()
                    if n.delivery_mode == Topic.DeliveryMode.QUEUE and n.link_id is None]
    moved: list[Published] = []
    dead: list[tuple[int, int]] = []
    touched = 0
    for topic in queue_topics:
        params = tree.effective(topic)
        cutoff = now - timedelta(seconds=int(params["retry_timeout"] or 30))
        stale = list(Delivery.objects.filter(
            message__topic_id=topic.pk, message__state=Message.State.PENDING,
            state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED],
        ).filter(Q(last_attempt__lte=cutoff) | Q(last_attempt__isnull=True, created__lte=cutoff))
            .select_related("message")[:1000])
        if not stale:
            continue
        subscribers = _receivers(_subscribers([topic], now)().get(topic.pk, ()), topic, now)
        for delivery in stale:
            touched += 1
            attempts = delivery.attempts + 1
            if attempts > int(params["max_retries"] or 0) or not subscribers:
                dead.append((delivery.account_id, delivery.message_id))
                continue
            later = [a for a in subscribers if a > delivery.account_id]
            target = later[0] if later else subscribers[0]
            with transaction.atomic():
                Delivery.objects.filter(pk=delivery.pk).update(
                    account_id=target, attempts=attempts, last_attempt=now,
                    state=Delivery.State.PENDING)
            moved.append(Published(delivery.message_id, topic.pk, topic.path,
                                   delivery.message.priority or NO_PRIORITY, [target]))
    if dead:
        mark_dead(dead)
    if moved:
        from broker.delivery import dispatcher as dispatch

        dispatch.wake_from_sync(moved)
    return touched
