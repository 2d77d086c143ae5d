"""Lean row writes for the hot paths (publish and ACK).

Django's ``bulk_create`` builds a model instance per row and compiles every value through the
field machinery, too costly on the publish path (bench/results/store-notes.md). Here rows are
plain tuples, already in the database's form (see :func:`db_datetime` and :func:`db_json`),
and go through the DB-API cursor: on SQLite one prepared statement per table, on PostgreSQL
one ``INSERT ... SELECT FROM unnest(<one binary array per column>)`` per batch (the
backends: :mod:`.backends`). Only the hot paths use this; everything else stays on the ORM.

Always inside the caller's transaction: :func:`hot_transaction`, which on PostgreSQL sends a
transaction's statements in pipeline mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .backends import Statement, Unsent, backend, raw_cursor

__all__ = ["Inserts", "Statement", "Table", "Unsent", "db_datetime", "db_json",
           "from_db_datetime", "hot_transaction", "lock_topics", "placeholder", "query",
           "raw_cursor", "reads_before_writing"]


def db_datetime(value: datetime | None) -> Any:
    """A datetime as the database takes it: SQLite naive UTC text (what Django's SQLite
    backend writes), PostgreSQL the aware datetime."""
    return backend().db_datetime(value)


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
    """The parameter mark of this database's driver."""
    return backend().placeholder


def query(sql: str, params: Sequence[Any] = ()) -> Callable[[], list[tuple]]:
    """Run a statement now; the returned function gives its rows. Inside
    :func:`hot_transaction` on PostgreSQL the statement is only sent, and reading its rows is
    what waits for the server: send every statement whose rows you need, then read them, and
    the lot costs one round trip."""
    return backend().query(sql, params)


def hot_transaction(*, relaxed: bool = False) -> AbstractContextManager[None]:
    """The transaction of a publish or ACK batch.

    ``relaxed`` commits without waiting for the disk flush (SQLite ``synchronous=NORMAL`` for
    this commit, PostgreSQL ``synchronous_commit = off``): the commit survives a crash of the
    process, not of the machine.

    PostgreSQL, outside any atomic block: the statements go out in pipeline mode between a
    BEGIN and a COMMIT of the transaction's own, so it costs one round trip per batch of
    results the code reads (:func:`query`) plus one for the COMMIT, not one per statement.
    A failing statement raises at the next read or at the COMMIT, and the transaction is
    rolled back. A connection found broken before the COMMIT went out raises
    :class:`Unsent`. ``transaction.on_commit`` hooks run after the COMMIT; an ``atomic()``
    inside joins the transaction.

    Otherwise (SQLite, or inside a caller's atomic block): ``transaction.atomic()``.
    """
    return backend().hot_transaction(relaxed)


@contextmanager
def reads_before_writing() -> Iterator[None]:
    """Around what a batch reads before its :func:`hot_transaction` (access snapshots,
    topics), in autocommit: a connection found broken there has committed nothing of the
    batch, so the error becomes :class:`Unsent` and the call may run again on a new
    connection. A storage process's look at the idle socket cannot see a goodbye still on
    its way (``pg_terminate_backend`` returns before the backend has ended)."""
    try:
        yield
    except Unsent:
        raise
    except Exception as exc:
        if backend().connection_broken():
            raise Unsent("the database connection was lost before any write") from exc
        raise


def lock_topics(topic_ids: Iterable[int], *, exclusive: bool) -> None:
    """PostgreSQL: advisory locks on topics until the transaction ends, in ascending order
    (no deadlock between two takers). A publish batch takes them shared before it reads the
    subscriptions of its topics, a MESSAGE subscription exclusive before it reads their
    messages, so that, under READ COMMITTED, one of the two always sees the other: without
    them a subscription committed while a publish ran could miss the message both ways.
    Nothing on SQLite, whose writers take turns."""
    ids = sorted(set(topic_ids))
    if ids:
        backend().lock_topics(ids, exclusive)


class Table:
    """INSERTs into one model's table: ``fields`` in that order, values as tuples."""

    def __init__(self, model: type[models.Model], fields: Sequence[str]) -> None:
        self.model = model
        self.fields = tuple(fields)
        self._sql: dict[Any, str] = {}

    def statement(self, key: Any, build: Callable[[], str]) -> str:
        """The SQL text ``build`` makes, made once per ``key`` (a backend's)."""
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = build()
        return sql

    def insert(self, rows: Sequence[tuple], into: Inserts | None = None) -> None:
        """INSERT ``rows`` now, or with the other INSERTs of ``into``."""
        if into is not None:
            into.add(self, rows)
        elif rows:
            backend().insert(self, rows, False)

    def reserve_pks(self, count: int) -> Callable[[], list[int]] | None:
        """PostgreSQL: ask the table's sequence for ``count`` new keys; the returned function
        reads them (ascending), for :meth:`insert_returning_pks`. Sent at once, read later
        (:func:`query`): ask for them together with whatever else the caller needs first.
        SQLite: ``None``, the keys come from the INSERTs themselves."""
        if count == 0:
            return None
        return backend().reserve_pks(self, count)

    def insert_returning_pks(self, rows: Sequence[tuple],
                             reserved: Callable[[], list[int]] | None = None,
                             into: Inserts | None = None) -> list[int]:
        """Insert (now, or with the other INSERTs of ``into``), and return the new primary
        keys in row order (ascending: smuids grow in publish order). PostgreSQL inserts keys
        taken from the sequence first (``reserved``, else taken now): one round trip for the
        keys, the rows go out pipelined. SQLite inserts at once, ``into`` or not."""
        if not rows:
            return []
        return backend().insert_returning_pks(self, rows, reserved, into)


class Inserts:
    """INSERTs into several tables that go to the database together (:meth:`run`).

    PostgreSQL: one statement however many tables, each part a data-modifying ``WITH``
    clause over arrays, so a publish batch's rows (messages, data sections, deliveries,
    usage events) cost the server one parse, plan and execute, and the client one
    statement, instead of four; its foreign keys are checked at the COMMIT (Django makes
    them deferrable, initially deferred), so the parts' order does not matter. Nothing added
    is read back before :meth:`run`. SQLite: each part is inserted as it is added (one
    executemany each)."""

    def __init__(self) -> None:
        self.parts: list[tuple[Table, Sequence[tuple], bool]] = []

    def add(self, table: Table, rows: Sequence[tuple], *, with_pk: bool = False) -> None:
        if rows:
            backend().add_insert(self, table, rows, with_pk)

    def run(self) -> None:
        parts, self.parts = self.parts, []
        if parts:
            backend().run_inserts(parts)

