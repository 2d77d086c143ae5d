"""The export step: one day of usage events from the database into Parquet files that the job
reads (:mod:`spark_jobs.jobs.schema`), so the job never touches the broker's live tables.

Rows are streamed (a server-side cursor on PostgreSQL) and written in record batches with
pyarrow, the maintained Parquet writer for Python: memory stays flat however long the day.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from django.db.models import Q
from django.db.models.fields.json import KT

from accounts.models import Account, LoginSession
from broker.models import Subscription, UsageEvent

from .jobs.schema import EVENTS_FILE, META_FILE, PRIOR_FILE

BATCH = 100_000
TS = pa.timestamp("us", tz="UTC")
EVENTS_SCHEMA = pa.schema([
    ("id", pa.int64()), ("at", TS), ("kind", pa.string()), ("account", pa.string()),
    ("topic", pa.string()), ("smuid", pa.int64()), ("bytes", pa.int64()),
    ("door", pa.string()), ("receivers", pa.int64()), ("reason", pa.string()),
    ("dead_account", pa.string()),
])
PRIOR_SCHEMA = pa.schema([
    ("smuid", pa.int64()), ("at", TS), ("account", pa.string()), ("topic", pa.string()),
    ("bytes", pa.int64()), ("door", pa.string()),
])


@dataclass
class Exported:
    events: int
    prior: int
    sessions_at_start: int
    subscribers_at_start: int


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """A report day is a UTC day: [00:00, next 00:00)."""
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _write(path: str, schema: pa.Schema, rows: Iterator[tuple],
           progress: Callable[[int], None] | None = None) -> int:
    """Stream ``rows`` (tuples in ``schema``'s order) into a Parquet file; returns the count."""
    names = schema.names
    count = 0
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        chunk: list[tuple] = []

        def flush() -> None:
            columns = list(zip(*chunk, strict=True)) if chunk else [[] for _ in names]
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.array(c, type=schema.field(n).type) for c, n in zip(columns, names,
                                                                        strict=True)],
                schema=schema))

        for row in rows:
            chunk.append(row)
            if len(chunk) >= BATCH:
                flush()
                count += len(chunk)
                chunk = []
                if progress:
                    progress(count)
        if chunk or count == 0:
            flush()  # an empty day still gets a file with its schema
            count += len(chunk)
    return count


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def export_day(day: date, out_dir: str, progress: Callable[[int], None] | None = None,
               until: datetime | None = None) -> Exported:
    """Write ``day``'s events (and what they need from earlier days) into ``out_dir``; with
    ``until`` (a partial report), only those before it."""
    start, end = day_bounds(day)
    if until is not None:
        end = min(end, until)
    os.makedirs(out_dir, exist_ok=True)
    names = dict(Account.objects.values_list("pk", "username"))
    day_events = UsageEvent.objects.filter(at__gte=start, at__lt=end)

    def event_rows() -> Iterator[tuple]:
        qs = (day_events.order_by()
              .annotate(d_door=KT("detail__door"), d_to=KT("detail__to"),
                        d_reason=KT("detail__reason"), d_account=KT("detail__account_id"))
              .values_list("pk", "at", "kind", "account", "topic", "smuid", "bytes",
                           "d_door", "d_to", "d_reason", "d_account"))
        for pk, at, kind, account, topic, smuid, size, door, to, reason, dead in \
                qs.iterator(chunk_size=20_000):
            dead_account = None
            if kind == "dead":
                dead_id = _int(dead)
                dead_account = names.get(dead_id, f"#{dead_id}") if dead_id is not None \
                    else ""
            yield (pk, at, kind, account, topic, smuid, size, door or None, _int(to),
                   reason, dead_account)

    events = _write(os.path.join(out_dir, EVENTS_FILE), EVENTS_SCHEMA, event_rows(), progress)

    # Publishes of earlier days (within the retention: older events are purged anyway) of
    # the messages this day's ACKs, expiries and dead letters name.
    named = day_events.filter(kind__in=["ack", "expire", "dead"], smuid__isnull=False)
    prior_qs = (UsageEvent.objects.filter(kind="publish", at__lt=start,
                                          smuid__in=named.order_by().values("smuid"))
                .order_by().annotate(d_door=KT("detail__door"))
                .values_list("smuid", "at", "account", "topic", "bytes", "d_door"))
    prior = _write(os.path.join(out_dir, PRIOR_FILE), PRIOR_SCHEMA,
                   ((s, a, acc, t, b, d or None) for s, a, acc, t, b, d in
                    prior_qs.iterator(chunk_size=20_000)))

    sessions = LoginSession.objects.filter(started__lt=start).filter(
        Q(ended__isnull=True) | Q(ended__gte=start)).count()
    # MESSAGE subscriptions open at the start: those still there made before it, and those
    # removed since whose UNSUBSCRIBE event says they were made before it.
    subscribers = Subscription.objects.filter(
        resource=Subscription.Resource.MESSAGE, created__lt=start).count()
    for created in UsageEvent.objects.filter(kind="unsubscribe", at__gte=start).values_list(
            KT("detail__created"), flat=True).iterator():
        try:
            if created and datetime.fromisoformat(created) < start:
                subscribers += 1
        except ValueError:
            pass
    meta = {"day": day.isoformat(), "start": start.isoformat(), "end": end.isoformat(),
            "events": events, "prior": prior, "sessions_at_start": sessions,
            "subscribers_at_start": subscribers}
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(meta, f)
    return Exported(events, prior, sessions, subscribers)
