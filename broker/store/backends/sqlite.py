"""SQLite: one writer, in this process; no round trips to save.

Statements run and are read at once; rows go as one ``executemany`` per table; keys come
from the INSERTs themselves. A rule PostgreSQL's statements apply in the database (which
messages an ACK batch finishes) is applied here in Python, from the facts read.

A storage process on a database in WAL mode with ``synchronous=FULL`` commits with NORMAL
and flushes the WAL itself (:meth:`SQLite.open_for_storage`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from broker.models import Delivery, Message

from ..messages import lock_deliveries_update, record_acks_each, start_timeouts
from . import Ack, Backend, Rows, marks, raw_cursor

if TYPE_CHECKING:
    from ..rows import Inserts, Table


class SQLite(Backend):
    vendor = "sqlite"
    placeholder = "?"
    # One writer: a second connection would wait for the lock in its busy handler (sleeps
    # of a millisecond and more) instead of in the database thread's queue.
    acks_apart = False

    def db_datetime(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return str(value.astimezone(UTC).replace(tzinfo=None))  # naive UTC, as Django writes

    def query(self, sql: str, params: Sequence[Any]) -> Rows:
        db = connections[DEFAULT_DB_ALIAS]
        db.ensure_connection()
        # Nothing to overlap: read at once, and leave no statement open.
        with closing(db.connection.cursor()) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return lambda: rows

    @contextmanager
    def hot_transaction(self, relaxed: bool) -> Iterator[None]:
        db = connections[DEFAULT_DB_ALIAS]
        # The pragma applies to the connection: set it only around a transaction of our own
        # (not inside a caller's), and put the configured level back afterwards. Nothing to
        # set where the configured level is relaxed already (a storage process that flushes
        # the WAL itself commits with NORMAL: open_for_storage).
        pragma = (relaxed and not db.in_atomic_block
                  and settings.SMQP_SQLITE_SYNCHRONOUS not in ("NORMAL", "OFF"))
        if pragma:
            with db.cursor() as cursor:
                cursor.execute("PRAGMA synchronous=NORMAL")
        try:
            with transaction.atomic():
                yield
        finally:
            if pragma:
                with db.cursor() as cursor:
                    cursor.execute(f"PRAGMA synchronous={settings.SMQP_SQLITE_SYNCHRONOUS}")

    def lock_topics(self, topic_ids: list[int], exclusive: bool) -> None:
        """Nothing: SQLite's writers take turns."""

    # ------------------------------------------------------------------ inserts

    def _insert_sql(self, table: Table, with_pk: bool) -> str:
        def build() -> str:
            meta = table.model._meta
            qn = connection.ops.quote_name
            columns = [meta.get_field(f).column for f in table.fields]
            if with_pk:
                columns.insert(0, meta.pk.column)
            return (f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(c) for c in columns)}) "
                    f"VALUES ({marks('?', len(columns))})")

        return table.statement(("sqlite", with_pk), build)

    def insert(self, table: Table, rows: Sequence[tuple], with_pk: bool) -> None:
        with raw_cursor() as cursor:
            cursor.executemany(self._insert_sql(table, with_pk), rows)

    def reserve_pks(self, table: Table, count: int) -> None:
        return None

    def insert_returning_pks(self, table: Table, rows: Sequence[tuple],
                             reserved: Callable[[], list[int]] | None,
                             into: Inserts | None) -> list[int]:
        # One executemany, ``into`` or not. The key is AUTOINCREMENT (each new row gets one
        # more than the largest the table ever had), and from its first INSERT the
        # transaction holds the database's write lock: the rows got the keys up to the last
        # one, in order. Outside a transaction (autocommit) the rows get one of their own.
        in_transaction = connections[DEFAULT_DB_ALIAS].in_atomic_block
        with (nullcontext() if in_transaction else transaction.atomic()), \
                raw_cursor() as cursor:
            cursor.executemany(self._insert_sql(table, False), rows)
            cursor.execute("SELECT last_insert_rowid()")
            last = cursor.fetchone()[0]
        return list(range(last - len(rows) + 1, last + 1))

    def add_insert(self, into: Inserts, table: Table, rows: Sequence[tuple],
                   with_pk: bool) -> None:
        self.insert(table, rows, with_pk)  # nothing gained by waiting

    def run_inserts(self, parts: list[tuple[Table, Sequence[tuple], bool]]) -> None:
        for table, rows, with_pk in parts:
            self.insert(table, rows, with_pk)

    # ------------------------------------------------------------------ ACKs

    def record_acks(self, acks: Sequence[Ack], now: datetime, *,
                    returning: bool) -> Callable[[], list[int]] | None:
        return record_acks_each(acks, now, returning=returning)

    def lock_deliveries(self, account_id: int, holder: str, smuids: Sequence[int],
                        now: datetime, deadline: datetime, max_retries: int) -> Rows:
        # One writer: a take never meets another's row lock.
        return lock_deliveries_update(account_id, holder, smuids, now, deadline, max_retries)

    def finish_messages(self, message_ids: list[int], now: datetime) -> None:
        """The facts are read, and the rule applied here (no round trips to save)."""
        # Each message once, with the states of its deliveries that are not ACKed (if any).
        rows = self.query(
            f"SELECT m.id, m.timeout, d.state FROM {Message._meta.db_table} m "
            f"LEFT JOIN {Delivery._meta.db_table} d ON d.message_id = m.id AND d.state <> ? "
            f"WHERE m.id IN ({marks('?', len(message_ids))})",
            [Delivery.State.ACKED.value, *message_ids])
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
        start_timeouts([(m, timeouts[m]) for m in done if m not in dead], now)

    # ------------------------------------------------------------------ storage processes

    def storage_processes_possible(self) -> bool:
        return not connection.is_in_memory_db()

    def flushes_behind(self) -> bool:
        return not connection.is_in_memory_db() and \
            settings.SMQP_SQLITE_SYNCHRONOUS in ("FULL", "EXTRA")

    def keep_statistics(self) -> None:
        """None kept: SQLite plans these queries from their indexes alone (its heuristics
        take an index to narrow well, which holds for them), whatever the row counts."""

    def before_storage_call(self) -> None:
        return None  # a file, no server that could have ended the connection

    def connection_broken(self) -> bool:
        return False

    def open_for_storage(self, database: str) -> str | None:
        """In WAL mode with ``synchronous=FULL`` (or EXTRA): this process commits with
        NORMAL instead, which writes the WAL without waiting for the disk, and flushes the
        WAL itself before it answers a call that must be durable. Returns the WAL file's
        path then, else None (the configured level stays).

        Why: this process is the database's one writer, and a small batch's commit would
        wait for the disk. Now calls already waiting commit before the flush (an ACK behind
        a publish no longer waits for the disk), and one flush covers every commit before
        it (group commit). What is answered is as durable as with FULL: a transaction is on
        disk once its WAL frames are, and a checkpoint (which may overwrite them later)
        flushes the WAL before and the database file after."""
        from django.db.backends.signals import connection_created

        if not self.flushes_behind():
            return None
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":  # the file system refused WAL
                return None

        def normal(sender: Any, connection: Any, **kwargs: Any) -> None:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA synchronous=NORMAL")

        # The level hot_transaction(relaxed=True) puts back after its own commit.
        settings.SMQP_SQLITE_SYNCHRONOUS = "NORMAL"
        connection_created.connect(normal, weak=False)  # a new connection after a lost one too
        normal(None, connection)
        return f"{database}-wal"
