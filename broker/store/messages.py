"""The statements the services' hot paths run on the message tables (messages, data sections,
deliveries, usage events), as plain rows (:mod:`.rows`), and the few whose form differs by
database (through :func:`.backends.backend`).

The services decide what is stored and who receives it; this module only says how it is
written and read back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, Subquery

from accounts.models import Account
from broker.domain.message import DataSection as SectionValue
from broker.models import DataSection, Delivery, Message, Subscription, UsageEvent

from .backends import Ack, Rows, backend, marks, raw_cursor
from .rows import Inserts, Table, db_datetime, db_json, placeholder, query

# --------------------------------------------------------------------------- publish rows


@dataclass(slots=True)
class NewMessage:
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
    sections: list[SectionValue]
    expires: datetime | None = None
    pk: int = 0


MESSAGES = Table(Message, (
    "topic", "publisher", "publisher_guid", "cmuid", "name", "priority", "created", "received",
    "timeout", "expires", "depth", "sequence", "receipt", "reply", "in_reply_to", "headers",
    "size", "state", "trashed"))
SECTIONS = Table(DataSection, (
    "message", "position", "content_type", "content_length", "content_encoding", "headers",
    "body"))
DELIVERIES = Table(Delivery, (
    "account", "message", "state", "attempts", "created", "last_attempt", "next_attempt",
    "acked"))
EVENTS = Table(UsageEvent, (
    "at", "kind", "account", "topic", "smuid", "bytes", "peer", "detail"))


def insert_messages(rows: list[NewMessage], now: datetime,
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
    pks = MESSAGES.insert_returning_pks([
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
    SECTIONS.insert(sections, into)


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


def insert_deliveries(pairs: list[tuple[int, int]], now: datetime,
                      into: Inserts | None = None) -> None:
    """New pending Delivery rows for (account, smuid) pairs (now, or with ``into``)."""
    at = db_datetime(now)
    pending = Delivery.State.PENDING.value
    DELIVERIES.insert([(a, m, pending, 0, at, None, None, None) for a, m in pairs], into)


#: A usage event: (kind, account, topic, smuid, bytes, peer, detail).
Event = tuple[str, str, str, int | None, int, str, dict]


def log_events(events: list[Event], now: datetime, into: Inserts | None = None) -> None:
    """Append usage events (now, or with ``into``)."""
    EVENTS.insert(event_rows(events, now), into)


def event_rows(events: list[Event], now: datetime) -> list[tuple]:
    """The rows of :func:`log_events` (for :data:`EVENTS`)."""
    at = db_datetime(now)
    return [(at, kind, account, topic, smuid, size, peer,
             db_json(detail) if detail else "{}")
            for kind, account, topic, smuid, size, peer, detail in events]


# --------------------------------------------------------------------------- subscriptions


def message_subscriptions(pattern_keys: Sequence[str], now: datetime) -> Rows:
    """(pattern key, account, since, selector class, selector) of the MESSAGE subscriptions
    with these pattern keys whose lease (if any) has not ended by ``now``; sent now, read by
    calling the result (see :func:`.rows.query`). ``since`` as the driver gives it
    (:func:`.rows.from_db_datetime`)."""
    ph = placeholder()
    return query(  # once per publish batch: plain SQL
        f"SELECT pattern_key, account_id, since, selector_class, selector "
        f"FROM {Subscription._meta.db_table} "
        f"WHERE resource = {ph} AND pattern_key IN ({marks(ph, len(pattern_keys))}) "
        f"AND (lease_end IS NULL OR lease_end > {ph})",
        [Subscription.Resource.MESSAGE.value, *pattern_keys, db_datetime(now)])


#: Messages read per page when a subscription with a selector takes its backlog.
BACKLOG_CANDIDATES_PAGE = 500


def backlog_candidates(account_id: int, topic_ids: set[int], *, queue: bool,
                       since: datetime | None, now: datetime,
                       after: int = 0) -> list[tuple[Message, str, str | None, str | None]]:
    """The messages :func:`add_backlog` would add, one page (smuid above ``after``), each
    with (topic path, publisher name, first data section's content type): for a selector
    to choose among."""
    held = Delivery.objects.filter(message_id=OuterRef("pk"))
    if not queue:
        held = held.filter(account_id=account_id)
    qs = (Message.objects.filter(topic_id__in=topic_ids, state=Message.State.PENDING,
                                 pk__gt=after)
          .filter(Q(expires__isnull=True) | Q(expires__gt=now))
          .exclude(Exists(held)))
    if since is not None:
        qs = qs.filter(received__gte=since)
    first_type = DataSection.objects.filter(message_id=OuterRef("pk"), position=0)
    rows = list(qs.select_related("topic", "publisher")
                .annotate(first_type=Subquery(first_type.values("content_type")[:1]))
                .order_by("pk")[:BACKLOG_CANDIDATES_PAGE])
    return [(m, m.topic.path, m.publisher.username if m.publisher else None, m.first_type)
            for m in rows]


def add_deliveries_ignoring_existing(account_id: int, smuids: list[int],
                                     now: datetime) -> int:
    """Pending deliveries to ``account_id`` of these messages, but none it has already.
    Returns how many were added."""
    had = set(Delivery.objects.filter(account_id=account_id, message_id__in=smuids)
              .values_list("message_id", flat=True))
    new = [m for m in smuids if m not in had]
    # (A conflict with a row made meanwhile is ignored: the account has it, once.)
    Delivery.objects.bulk_create(
        [Delivery(account_id=account_id, message_id=m) for m in new], ignore_conflicts=True)
    return len(new)


def add_backlog(account_id: int, topic_ids: set[int], *, queue: bool,
                since: datetime | None, now: datetime, forwardable_only: bool = False) -> int:
    """Pending deliveries to ``account_id`` of the messages held on these topics (published
    after ``since``, not expired) that it has none of yet; with ``queue``, only of messages
    nobody holds; with ``forwardable_only``, only of messages whose Depth is not 0. One
    INSERT ... SELECT however many; returns how many were added."""
    ph = placeholder()
    deliveries, messages = Delivery._meta.db_table, Message._meta.db_table
    held_by = "" if queue else f"AND d.account_id = {ph} "
    params: list = [account_id, Delivery.State.PENDING.value, db_datetime(now),
                    *sorted(topic_ids), Message.State.PENDING.value, db_datetime(now)]
    received = ""
    if since is not None:
        received = f"AND m.received >= {ph} "
        params.append(db_datetime(since))
    if forwardable_only:
        received += "AND m.depth <> 0 "
    if not queue:
        params.append(account_id)
    with raw_cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {deliveries} (account_id, message_id, state, attempts, created, "
            f"last_attempt, next_attempt, acked) "
            f"SELECT {ph}, m.id, {ph}, 0, {ph}, NULL, NULL, NULL FROM {messages} m "
            f"WHERE m.topic_id IN ({marks(ph, len(topic_ids))}) AND m.state = {ph} "
            f"AND (m.expires IS NULL OR m.expires > {ph}) {received}"
            f"AND NOT EXISTS (SELECT 1 FROM {deliveries} d WHERE d.message_id = m.id "
            f"{held_by}) ORDER BY m.id ON CONFLICT DO NOTHING", params)
        return max(cursor.rowcount, 0)


# --------------------------------------------------------------------------- timeouts


def expiry(timeout: int | None, now: datetime) -> datetime | None:
    """When a message whose timeout starts ``now`` expires: never for a state message
    (negative timeout) or one without a timeout."""
    if timeout is None or timeout < 0:
        return None
    return now + timedelta(seconds=timeout)


def start_timeouts(messages: list[tuple[int, int | None]], now: datetime) -> None:
    """The timeout of these (smuid, timeout) messages starts now, unless it has: their
    expiry is set (none for a state message or one without a timeout)."""
    groups: dict[datetime, list[int]] = defaultdict(list)
    for pk, timeout in messages:
        expires = expiry(timeout, now)
        if expires is not None:
            groups[expires].append(pk)
    if not groups:
        return
    ph = placeholder()
    with raw_cursor() as cursor:
        for expires, ids in groups.items():
            cursor.execute(
                f"UPDATE {Message._meta.db_table} SET expires = {ph} "
                f"WHERE id IN ({marks(ph, len(ids))}) AND expires IS NULL",
                [db_datetime(expires), *ids])


# --------------------------------------------------------------------------- ACKs


def record_acks(acks: Sequence[Ack], now: datetime, *,
                returning: bool) -> Callable[[], list[int]] | None:
    """The deliveries of ``acks`` become ACKed (once per account and message, ever; a row is
    created for a message that came from a backlog), inside the caller's transaction. With
    ``returning``: a function giving the smuids ACKed for the first time (reading it may
    wait for the database), else None."""
    return backend().record_acks(acks, now, returning=returning)


def acked_upsert(select: str) -> str:
    """The ACK's upsert, its rows from ``select`` (account, message, state, attempts,
    created, last_attempt, next_attempt, acked): the delivery row becomes ACKed, or is
    created ACKed (a subscriber that arrived later got the message from the backlog, with
    no row yet). A row ACKed before stays as it is and is not returned: only first ACKs
    come back. The select gives no row for an account deleted after its snapshot was
    cached."""
    return (f"INSERT INTO {Delivery._meta.db_table} AS d (account_id, message_id, state, "
            f"attempts, created, last_attempt, next_attempt, acked) {select} "
            f"ON CONFLICT (account_id, message_id) DO UPDATE SET state = excluded.state, "
            f"acked = excluded.acked, last_attempt = excluded.last_attempt "
            f"WHERE d.state <> excluded.state")


def record_acks_each(acks: Sequence[Ack], now: datetime, *,
                     returning: bool) -> Callable[[], list[int]] | None:
    """:func:`record_acks` as one statement per ACK (rows read back for ``returning``)."""
    ph = placeholder()
    upsert = acked_upsert(f"SELECT {ph}, id, {ph}, {ph}, {ph}, {ph}, NULL, {ph} "
                          f"FROM {Message._meta.db_table} WHERE id = {ph} AND EXISTS "
                          f"(SELECT 1 FROM {Account._meta.db_table} WHERE id = {ph})")
    at = db_datetime(now)
    acked = Delivery.State.ACKED.value
    params = [(ack.account_id, acked, ack.attempts, at, at, at, ack.smuid, ack.account_id)
              for ack in acks]
    if not returning:
        with raw_cursor() as cursor:
            cursor.executemany(upsert, params)
        return None
    firsts = [(ack.smuid, query(upsert + " RETURNING message_id", p))
              for ack, p in zip(acks, params, strict=True)]
    return lambda: [smuid for smuid, rows in firsts if rows()]


def finish_messages(message_ids: list[int], now: datetime) -> None:
    """Messages with no delivery still open start their timeout; those with dead
    deliveries and none open go to Trash (for audit) at once. Inside the caller's
    transaction."""
    if message_ids:
        backend().finish_messages(message_ids, now)


# --------------------------------------------------------------------------- queue-mode locks
# Conditions on the delivery row's own columns only, so that the database checks them again
# on the row version it updates (see broker.services.locks); RETURNING says who won, and
# can be read inside a pipelined hot transaction (a cursor's rowcount cannot).


def lock_delivery(account_id: int, holder: str, smuid: int, now: datetime,
                  deadline: datetime, max_retries: int) -> Rows:
    """Lock the account's delivery of ``smuid`` to ``holder`` until ``deadline``, counting an
    attempt: if it is unlocked (PENDING), or locked to ``holder`` already, or its lock
    expired; if it has no more than ``max_retries`` attempts; and if the message still
    waits. Its rows (one when locked) are read by calling the result."""
    return lock_deliveries(account_id, holder, [smuid], now, deadline, max_retries)


def lock_deliveries(account_id: int, holder: str, smuids: Sequence[int], now: datetime,
                    deadline: datetime, max_retries: int) -> Rows:
    """:func:`lock_delivery` of several of the account's deliveries in one statement (a REST
    pull's): each row is locked or not on its own conditions. Rows (message_id, attempts)
    of those locked, read by calling the result. On PostgreSQL a row another transaction
    holds is passed by (it is that taker's), never waited for (see the backend)."""
    return backend().lock_deliveries(account_id, holder, smuids, now, deadline, max_retries)


def lock_conditions(table: str, ph: str, count: int) -> str:
    """The WHERE of a lock take on ``table`` (the deliveries, or their alias), ``count``
    smuids: its parameters are :func:`lock_params`' after the first four."""
    return (f"{table}.account_id = {ph} AND {table}.message_id IN ({marks(ph, count)}) "
            f"AND {table}.attempts <= {ph} "
            f"AND ({table}.state = {ph} OR ({table}.state = {ph} "
            f"AND ({table}.holder = {ph} OR {table}.next_attempt <= {ph}))) "
            f"AND EXISTS (SELECT 1 FROM {Message._meta.db_table} m "
            f"WHERE m.id = {table}.message_id AND m.state = {ph})")


def lock_params(account_id: int, holder: str, smuids: Sequence[int], now: datetime,
                deadline: datetime, max_retries: int) -> list:
    """The parameters of a lock take: the SET's four (state, holder, last and next attempt),
    then :func:`lock_conditions`'."""
    at = db_datetime(now)
    locked = Delivery.State.NOTIFIED.value
    return [locked, holder, at, db_datetime(deadline), account_id, *smuids, max_retries,
            Delivery.State.PENDING.value, locked, holder, at, Message.State.PENDING.value]


#: The SET of a lock take (its parameters: the first four of :func:`lock_params`).
LOCK_SET = ("state = {ph}, holder = {ph}, attempts = attempts + 1, last_attempt = {ph}, "
            "next_attempt = {ph}")


def lock_deliveries_update(account_id: int, holder: str, smuids: Sequence[int],
                           now: datetime, deadline: datetime, max_retries: int) -> Rows:
    """:func:`lock_deliveries` as one conditional UPDATE: a row another transaction is
    changing is waited for, then its conditions are checked again on what it committed
    (SQLite has one writer: nothing to wait for there)."""
    ph = placeholder()
    table = Delivery._meta.db_table
    return query(
        f"UPDATE {table} SET {LOCK_SET.format(ph=ph)} "
        f"WHERE {lock_conditions(table, ph, len(smuids))} RETURNING message_id, attempts",
        lock_params(account_id, holder, smuids, now, deadline, max_retries))


def consume_locks(account_id: int, holder: str, smuids: Sequence[int], now: datetime) -> Rows:
    """The account's deliveries of ``smuids`` become ACKED where ``holder`` holds their lock
    and the lock has not expired, in one statement. Rows (one per message consumed), read
    by calling the result."""
    ph = placeholder()
    at = db_datetime(now)
    return query(
        f"UPDATE {Delivery._meta.db_table} SET state = {ph}, holder = '', acked = {ph} "
        f"WHERE account_id = {ph} AND message_id IN ({marks(ph, len(smuids))}) "
        f"AND state = {ph} AND holder = {ph} AND next_attempt > {ph} RETURNING message_id",
        [Delivery.State.ACKED.value, at, account_id, *smuids, Delivery.State.NOTIFIED.value,
         holder, at])
