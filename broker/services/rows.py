"""Lean row writes for the hot paths (publish and ACK).

Django's ``bulk_create`` builds a model instance per row and compiles every value through the
field machinery; on the publish path that was over half of the listener's CPU. Here rows are
plain tuples, already in the database's form (see :func:`db_datetime` and :func:`db_json`),
and go through the DB-API cursor with one prepared statement per table. Only the hot paths
use this; everything else stays on the ORM.

Works on SQLite and PostgreSQL (the two backends the broker runs on), always inside the
caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

_vendor: str | None = None


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


def db_json(value: Any) -> Any:
    if vendor() == "sqlite":
        return json.dumps(value)
    return connections[DEFAULT_DB_ALIAS].ops.adapt_json_value(value, None)


def placeholder() -> str:
    return "?" if vendor() == "sqlite" else "%s"


@contextmanager
def raw_cursor() -> Iterator[Any]:
    """The DB-API cursor of the current connection (its transaction is the caller's)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    with closing(wrapper.connection.cursor()) as cursor:
        yield cursor


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

    def insert(self, rows: Sequence[tuple]) -> None:
        if rows:
            with raw_cursor() as cursor:
                cursor.executemany(self._insert_sql(False), rows)

    def insert_returning_pks(self, rows: Sequence[tuple]) -> list[int]:
        """Insert, and return the new primary keys in row order (ascending: smuids grow in
        publish order)."""
        if not rows:
            return []
        with raw_cursor() as cursor:
            if vendor() == "postgresql":
                # Take the keys from the sequence first, then insert them explicitly: one
                # round trip for the keys and one pipelined executemany for the rows.
                meta = self.model._meta
                cursor.execute(
                    "SELECT nextval(pg_get_serial_sequence(%s, %s)) "
                    "FROM generate_series(1, %s)", (meta.db_table, meta.pk.column, len(rows)))
                pks = sorted(pk for (pk,) in cursor.fetchall())
                cursor.executemany(self._insert_sql(True),
                                   [(pk, *row) for pk, row in zip(pks, rows, strict=True)])
                return pks
            sql = self._insert_sql(False)
            pks = []
            for row in rows:
                cursor.execute(sql, row)
                pks.append(cursor.lastrowid)
            return pks
