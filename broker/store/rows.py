"""Lean row writes for the hot paths (publish and ACK).

Django's ``bulk_create`` builds a model instance per row and compiles every value through the
field machinery; on the publish path that was over half of the listener's CPU. Here rows are
plain tuples, already in the database's form (see :func:`db_datetime` and :func:`db_json`),
and go through the DB-API cursor: on SQLite one prepared statement per table, on PostgreSQL
one ``INSERT ... SELECT FROM unnest(<one binary array per column>)`` per batch. Only the hot
paths use this; everything else stays on the ORM.

Works on SQLite and PostgreSQL (the two backends the broker runs on), always inside the
caller's transaction: :func:`hot_transaction`, which on PostgreSQL sends a transaction's
statements in pipeline mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager, nullcontext, suppress
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, models, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

_vendor: str | None = None
_IDLE = psycopg.pq.TransactionStatus.IDLE


def vendor() -> str:
    """The database vendor (``sqlite`` or ``postgresql``), looked up once per process: these
    helpers run many times per message, and each ``django.db.connection`` attribute costs a
    context-local lookup."""
    global _vendor
    if _vendor is None:
        _vendor = connections[DEFAULT_DB_ALIAS].vendor
    return _vendor


def db_datetime(value: datetime | None) -> Any:
    """A datetime as the database takes it: SQLite naive UTC text (what Django's SQLite
    backend writes), PostgreSQL the aware datetime."""
    if value is None or vendor() != "sqlite":
        return value
    return str(value.astimezone(UTC).replace(tzinfo=None))


def from_db_datetime(value: Any) -> datetime | None:
    """A datetime column read through the DB-API (SQLite gives naive UTC text)."""
    if value is None or isinstance(value, datetime):
        return value
    parsed = parse_datetime(value)
    if parsed is not None and timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    return parsed


def db_json(value: Any) -> str:
    """A JSON column's value as :meth:`Table.insert` takes it: JSON text."""
    return json.dumps(value)


def placeholder() -> str:
    return "?" if vendor() == "sqlite" else "%s"


@contextmanager
def raw_cursor() -> Iterator[Any]:
    """The DB-API cursor of the current connection (its transaction is the caller's)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    with closing(wrapper.connection.cursor()) as cursor:
        yield cursor


@contextmanager
def server_cursor() -> Iterator[Any]:
    """PostgreSQL: a psycopg cursor with server-side binding on the current connection:
    array parameters go as binary arrays (``= ANY(%s)``, ``unnest(%s)``), not as text."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    with closing(psycopg.Cursor(wrapper.connection)) as cursor:
        yield cursor


def query(sql: str, params: Sequence[Any] = ()) -> Callable[[], list[tuple]]:
    """Run a statement now; the returned function gives its rows. Inside
    :func:`hot_transaction` on PostgreSQL the statement is only sent, and reading its rows is
    what waits for the server: send every statement whose rows you need, then read them, and
    the lot costs one round trip."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    cursor = wrapper.connection.cursor()
    cursor.execute(sql, params)
    if vendor() == "sqlite":  # no round trips: read at once, leave no statement open
        with closing(cursor):
            rows = cursor.fetchall()
        return lambda: rows

    def read() -> list[tuple]:
        with closing(cursor):
            return cursor.fetchall()

    return read


class Unsent(Exception):
    """The connection broke before the transaction's COMMIT went out (the database restarted
    while the connection sat idle, say): nothing of it was committed, so it may run again on
    a new connection (:func:`broker.store.dbthread.call_here` does, once)."""


@contextmanager
def hot_transaction(*, relaxed: bool = False) -> Iterator[None]:
    """The transaction of a publish or ACK batch.

    ``relaxed`` commits without waiting for the disk flush (SQLite ``synchronous=NORMAL`` for
    this commit, PostgreSQL ``synchronous_commit = off``): the commit survives a crash of the
    process, not of the machine.

    PostgreSQL, outside any atomic block: the statements go out in pipeline mode between a
    BEGIN and a COMMIT of this function's own, so the transaction costs one round trip per
    batch of results the code reads (:func:`query`) plus one for the COMMIT, not one per
    statement (an ACK took 7; on a loaded 2-core machine each is about half a millisecond).
    A failing statement raises at the next read or at the COMMIT, and the transaction is
    rolled back. The transaction skips Django's health check (a round trip of its own): a
    connection found broken before the COMMIT went out raises :class:`Unsent` instead.
    ``transaction.on_commit`` hooks run after the COMMIT; an ``atomic()`` inside joins this
    transaction without a savepoint (an error inside it dooms the transaction).

    Otherwise (SQLite, or inside a caller's atomic block): ``transaction.atomic()``.
    """
    wrapper = connections[DEFAULT_DB_ALIAS]
    if vendor() != "postgresql" or wrapper.in_atomic_block or not wrapper.get_autocommit():
        with _atomic(wrapper, relaxed):
            yield
        return
    wrapper.ensure_connection()
    raw = wrapper.connection
    # Django is told it is inside an atomic block, as Atomic itself does for a transaction
    # it did not open: an atomic() inside (bulk_create has one) then nests instead of
    # switching autocommit, and transaction.on_commit() hooks wait for the COMMIT.
    wrapper.in_atomic_block, wrapper.commit_on_exit = True, False
    wrapper.needs_rollback, wrapper.savepoint_ids = False, []
    committed = commit_sent = False
    try:
        with wrapper.wrap_database_errors:  # Django's exceptions; a broken link is noticed
            try:
                with raw.pipeline():
                    raw.execute("BEGIN")
                    if relaxed:
                        raw.execute("SET LOCAL synchronous_commit = off")
                    yield
                    if wrapper.needs_rollback:  # an error was caught inside: never commit
                        raise transaction.TransactionManagementError(
                            "an error inside the transaction left it unusable")
                    raw.execute("COMMIT")
                    commit_sent = True  # queued: it leaves with the pipeline's last sync
                committed = True
            except BaseException as exc:
                _after_failure(wrapper, raw, exc, rerun=not commit_sent and raw.broken)
                raise
    finally:
        wrapper.in_atomic_block, wrapper.commit_on_exit = False, True
        wrapper.needs_rollback, wrapper.savepoint_ids = False, []
        if not committed:
            wrapper.run_on_commit = []
    wrapper.run_and_clear_commit_hooks()


Statement = tuple[str, Sequence[Any]]


def _after_failure(wrapper: Any, raw: Any, exc: BaseException, *, rerun: bool) -> None:
    """A PostgreSQL transaction of ours failed. A lost connection (psycopg: a broken one is
    always closed too) is left for Django to drop, and raises :class:`Unsent` when the caller
    may run the transaction again (``rerun``); otherwise an open transaction is rolled back."""
    if raw.closed:
        wrapper.errors_occurred = True  # Django drops the connection after
        if rerun:
            raise Unsent("the database connection was lost") from exc
    elif raw.info.transaction_status != _IDLE:
        with suppress(Exception):
            raw.execute("ROLLBACK")


@contextmanager
def _atomic(wrapper: Any, relaxed: bool) -> Iterator[None]:
    # SQLite's pragma applies to the connection, so set it only around a transaction of our
    # own (not inside a caller's), and put the configured level back afterwards.
    # Nothing to set where the configured level is relaxed already (a storage process that
    # flushes the WAL itself commits with NORMAL: broker.store.storage.flush_behind).
    sqlite = (relaxed and vendor() == "sqlite" and not wrapper.in_atomic_block
              and settings.SMQP_SQLITE_SYNCHRONOUS not in ("NORMAL", "OFF"))
    if sqlite:
        with wrapper.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")
    try:
        with transaction.atomic():
            if relaxed and vendor() == "postgresql":
                with wrapper.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit = off")
            yield
    finally:
        if sqlite:
            with wrapper.cursor() as cursor:
                cursor.execute(f"PRAGMA synchronous={settings.SMQP_SQLITE_SYNCHRONOUS}")


#: The first key of the advisory locks :func:`lock_topics` takes ("SMQP").
TOPIC_LOCK_SPACE = 0x534D5150


def lock_topics(topic_ids: Iterable[int], *, exclusive: bool) -> None:
    """PostgreSQL: advisory locks on topics until the transaction ends, in ascending order
    (no deadlock between two takers). A publish batch takes them shared before it reads the
    subscriptions of its topics, a MESSAGE subscription exclusive before it reads their
    messages, so that, under READ COMMITTED, one of the two always sees the other: without
    them a subscription committed while a publish ran could miss the message both ways.
    Nothing on SQLite, whose writers take turns."""
    ids = sorted(set(topic_ids))
    if vendor() != "postgresql" or not ids:
        return
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with server_cursor() as cursor:
        cursor.execute(f"SELECT {function}({TOPIC_LOCK_SPACE}, (t %% 2147483647)::int4) "
                       f"FROM unnest(%s::bigint[]) AS u(t)", [ids])


class Table:
    """INSERTs into one model's table: ``fields`` in that order, values as tuples."""

    def __init__(self, model: type[models.Model], fields: Sequence[str]) -> None:
        self.model = model
        self.fields = tuple(fields)
        self._sql: dict[tuple[str, bool], str] = {}

    def _insert_sql(self, with_pk: bool) -> str:
        key = (vendor(), with_pk)
        sql = self._sql.get(key)
        if sql is None:
            meta = self.model._meta
            qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
            columns = [meta.get_field(f).column for f in self.fields]
            if with_pk:
                columns.insert(0, meta.pk.column)
            marks = ", ".join([placeholder()] * len(columns))
            sql = self._sql[key] = (f"INSERT INTO {qn(meta.db_table)} "
                                    f"({', '.join(qn(c) for c in columns)}) VALUES ({marks})")
        return sql

    def insert(self, rows: Sequence[tuple], into: Inserts | None = None) -> None:
        """INSERT ``rows`` now, or with the other INSERTs of ``into``."""
        if into is not None:
            into.add(self, rows)
        elif rows:
            self._insert(rows, False)

    def _insert(self, rows: Sequence[tuple], with_pk: bool) -> None:
        if vendor() != "postgresql":
            with raw_cursor() as cursor:
                cursor.executemany(self._insert_sql(with_pk), rows)
            return
        # PostgreSQL: one statement however many rows, one array per column, in binary:
        # no SQL text built per row, one plan. Per-row executes
        # cost the server a statement each, and psycopg a formatted query text each.
        _execute_over_arrays(self._unnest_sql(with_pk), [rows])

    def _unnest_sql(self, with_pk: bool) -> str:
        key = ("unnest", with_pk)
        sql = self._sql.get(key)
        if sql is None:
            wrapper = connections[DEFAULT_DB_ALIAS]
            meta = self.model._meta
            fields = [meta.get_field(f) for f in self.fields]
            if with_pk:
                fields.insert(0, meta.pk)
            types = [f.rel_db_type(wrapper) if f.is_relation else f.db_type(wrapper)
                     for f in fields]
            # JSON goes as text (db_json) and becomes jsonb in the SELECT.
            arrays = ", ".join(f"%b::{'text' if t == 'jsonb' else t}[]" for t in types)
            values = ", ".join(f"c{i}::jsonb" if t == "jsonb" else f"c{i}"
                               for i, t in enumerate(types))
            names = ", ".join(f"c{i}" for i in range(len(types)))
            sql = self._sql[key] = (
                f"INSERT INTO {wrapper.ops.quote_name(meta.db_table)} "
                f"({', '.join(wrapper.ops.quote_name(f.column) for f in fields)}) "
                f"SELECT {values} FROM unnest({arrays}) AS u({names})")
        return sql

    def reserve_pks(self, count: int) -> Callable[[], list[int]] | None:
        """PostgreSQL: ask the table's sequence for ``count`` new keys; the returned function
        reads them (ascending), for :meth:`insert_returning_pks`. Sent at once, read later
        (:func:`query`): ask for them together with whatever else the caller needs first.
        SQLite: ``None``, the keys come from the INSERTs themselves."""
        if vendor() != "postgresql" or count == 0:
            return None
        meta = self.model._meta
        read = query("SELECT nextval(pg_get_serial_sequence(%s, %s)) "
                     "FROM generate_series(1, %s)", (meta.db_table, meta.pk.column, count))
        return lambda: sorted(pk for (pk,) in read())

    def insert_returning_pks(self, rows: Sequence[tuple],
                             reserved: Callable[[], list[int]] | None = None,
                             into: Inserts | None = None) -> list[int]:
        """Insert (now, or with the other INSERTs of ``into``), and return the new primary
        keys in row order (ascending: smuids grow in publish order). PostgreSQL inserts keys
        taken from the sequence first (``reserved``, else taken now): one round trip for the
        keys, the rows go out pipelined. SQLite inserts at once, ``into`` or not."""
        if not rows:
            return []
        if vendor() == "postgresql":
            pks = (reserved or self.reserve_pks(len(rows)))()  # type: ignore[misc]
            keyed = [(pk, *row) for pk, row in zip(pks, rows, strict=True)]
            if into is not None:
                into.add(self, keyed, with_pk=True)
            else:
                self._insert(keyed, True)
            return pks
        # SQLite: one executemany. The key is AUTOINCREMENT (each new row gets one more than
        # the largest the table ever had), and from its first INSERT the transaction holds
        # the database's write lock: the rows got the keys up to the last one, in order.
        # Outside a transaction (autocommit) the rows get one of their own.
        wrapper = connections[DEFAULT_DB_ALIAS]
        with (nullcontext() if wrapper.in_atomic_block else transaction.atomic()), \
                raw_cursor() as cursor:
            cursor.executemany(self._insert_sql(False), rows)
            cursor.execute("SELECT last_insert_rowid()")
            last = cursor.fetchone()[0]
        return list(range(last - len(rows) + 1, last + 1))


class Inserts:
    """INSERTs into several tables that go to the database together (:meth:`run`).

    PostgreSQL: one statement however many tables, each part a data-modifying ``WITH``
    clause over arrays (:meth:`Table._unnest_sql`), so a publish batch's rows (messages,
    data sections, deliveries, usage events) cost the server one parse, plan and execute,
    and the client one statement, instead of four; its foreign keys are checked at the
    COMMIT (Django makes them deferrable, initially deferred), so the parts' order does not
    matter. Nothing added is read back before :meth:`run`. Elsewhere each part is inserted
    as it is added (SQLite: one executemany each)."""

    def __init__(self) -> None:
        self._parts: list[tuple[Table, Sequence[tuple], bool]] = []

    def add(self, table: Table, rows: Sequence[tuple], *, with_pk: bool = False) -> None:
        if not rows:
            return
        if vendor() != "postgresql":
            table._insert(rows, with_pk)
        else:
            self._parts.append((table, rows, with_pk))

    def run(self) -> None:
        parts, self._parts = self._parts, []
        if len(parts) == 1:
            table, rows, with_pk = parts[0]
            table._insert(rows, with_pk)
        elif parts:
            key = tuple((id(table), with_pk) for table, _, with_pk in parts)
            sql = _GROUPED.get(key)
            if sql is None:
                clauses = [table._unnest_sql(with_pk) for table, _, with_pk in parts]
                sql = _GROUPED[key] = "WITH " + ", ".join(
                    f"p{i} AS ({clause})" for i, clause in enumerate(clauses[:-1])
                ) + " " + clauses[-1]
            _execute_over_arrays(sql, [rows for _, rows, _ in parts])


def _execute_over_arrays(sql: str, row_sets: Sequence[Sequence[tuple]]) -> None:
    """PostgreSQL: run ``sql`` with one array parameter per column of each row set, in
    order, with server-side binding (prepared after a few runs where the connection
    prepares: broker.store.storage)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    with closing(psycopg.Cursor(wrapper.connection)) as cursor:
        cursor.execute(sql, [list(column) for rows in row_sets
                             for column in zip(*rows, strict=True)])


#: :meth:`Inserts.run`'s statements, by the tables (and keys) of their parts.
_GROUPED: dict[tuple[tuple[int, bool], ...], str] = {}
