"""The statements of QQP's ResourceID claims (:class:`broker.models.QQPResource`), written in
the transaction of the publish batch that stores the items (the rules:
:mod:`broker.services.qqp_resources`).

A claim is an INSERT that skips what the unique constraint (account, ResourceID) already
holds: on PostgreSQL a claim another transaction has written and not yet committed makes it
wait for that transaction's end, so of two batches with one ResourceID only one claims it;
on SQLite the writers take turns anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from broker.models import Message, QQPResource

from .backends import backend, raw_cursor
from .rows import db_datetime, from_db_datetime, placeholder, query

#: (account id, ResourceID)
Key = tuple[int, str]

_TABLE = QQPResource._meta.db_table


def claim(keys: Sequence[Key], now: datetime) -> Callable[[], set[Key]]:
    """INSERT a claim (no smuid yet) for each of ``keys`` (distinct) that has no row; the
    returned function reads which were claimed (sent now, read later: see
    :func:`.rows.query`). Sorted, so that two batches take the rows' locks in one order."""
    ordered = sorted(keys)
    p = placeholder()
    at = db_datetime(now)
    values = ", ".join(f"({p}, {p}, NULL, {p})" for _ in ordered)
    params: list = []
    for account_id, resource_id in ordered:
        params += [account_id, resource_id, at]
    rows = query(f"INSERT INTO {_TABLE} (account_id, resource_id, smuid, received) "
                 f"VALUES {values} ON CONFLICT (account_id, resource_id) DO NOTHING "
                 f"RETURNING account_id, resource_id", params)
    return lambda: {(a, r) for a, r in rows()}


def held(keys: Sequence[Key]) -> dict[Key, tuple[int | None, datetime | None]]:
    """(smuid, received) of the rows ``keys`` have (committed: the caller's claim of them
    found them there), locked until the transaction ends on PostgreSQL: of two batches
    that would take over one forgotten row, the second waits and reads the first's."""
    if not keys:
        return {}
    p = placeholder()
    pairs = " OR ".join(f"(account_id = {p} AND resource_id = {p})" for _ in keys)
    params = [v for key in keys for v in key]
    lock = " FOR UPDATE" if backend().vendor == "postgresql" else ""
    found = query(f"SELECT account_id, resource_id, smuid, received FROM {_TABLE} "
                  f"WHERE {pairs} ORDER BY account_id, resource_id{lock}", params)()
    return {(a, r): (smuid, _aware(received)) for a, r, smuid, received in found}


def _aware(value: object) -> datetime | None:
    # SQLite's driver may give naive UTC datetimes (its declared-type converters).
    found = from_db_datetime(value)
    if found is not None and found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    return found


def record(stored: Sequence[tuple[Key, int]], now: datetime) -> None:
    """The claimed ResourceIDs' items were stored: each row gets its smuid, received now."""
    if not stored:
        return
    at = db_datetime(now)
    p = placeholder()
    with raw_cursor() as cursor:
        cursor.executemany(
            f"UPDATE {_TABLE} SET smuid = {p}, received = {p} "
            f"WHERE account_id = {p} AND resource_id = {p}",
            [(smuid, at, a, r) for (a, r), smuid in stored])


def drop(keys: Sequence[Key]) -> None:
    """Claims made in this transaction whose items were refused after all: they go."""
    if not keys:
        return
    p = placeholder()
    with raw_cursor() as cursor:
        cursor.executemany(
            f"DELETE FROM {_TABLE} WHERE account_id = {p} AND resource_id = {p} "
            f"AND smuid IS NULL", list(keys))


def stored_message(account_id: int, resource_id: str) -> int | None:
    """The smuid of the account's message with this Cmuid, if it has one (a claim written
    by an earlier version of the door, committed before its message: the message tells)."""
    p = placeholder()
    found = query(f"SELECT id FROM {Message._meta.db_table} "
                  f"WHERE publisher_id = {p} AND cmuid = {p} ORDER BY id LIMIT 1",
                  [account_id, resource_id])()
    return found[0][0] if found else None

