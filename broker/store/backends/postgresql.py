"""PostgreSQL: round trips are what costs.

- A hot transaction's statements go out in pipeline mode between a BEGIN and a COMMIT of its
  own: one round trip per batch of results read, plus the COMMIT's.
- Rows go as one ``INSERT ... SELECT FROM unnest(<one binary array per column>)`` per table,
  and a batch's tables in one statement of data-modifying ``WITH`` clauses.
- An ACK batch is one upsert over arrays, and one UPDATE that applies the finishing rule
  itself, so nothing is read back.
- Statements that find rows are never prepared (:func:`execute_unprepared`); only the
  INSERTs over arrays are, where the connection prepares (a storage process:
  :meth:`PostgreSQL.open_for_storage`).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from accounts.models import Account
from broker.models import Delivery, Message

from ..messages import LOCK_SET, acked_upsert, lock_conditions, lock_params, record_acks_each
from . import Ack, Backend, Rows, Statement, Unsent, marks

logger = logging.getLogger("broker.store.backends.postgresql")

if TYPE_CHECKING:
    from ..rows import Inserts, Table

#: The first key of the advisory locks on topics ("SMQP"; see :func:`..rows.lock_topics`).
TOPIC_LOCK_SPACE = 0x534D5150


@contextmanager
def server_cursor() -> Iterator[psycopg.Cursor]:
    """A psycopg cursor with server-side binding on the current connection: array
    parameters go as binary arrays (``= ANY(%s)``, ``unnest(%s)``), not as text."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with closing(psycopg.Cursor(db.connection)) as cursor:
        yield cursor


def execute_unprepared(statements: list[Statement]) -> None:
    """Run statements with server-side binding, each planned for its values, never
    prepared. A statement that finds rows may get a generic plan that reads far more of them
    than the plan made for its arrays, while the tables' statistics are young and they grow
    (bench/results/store-notes.md)."""
    with server_cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params, prepare=False)


def _execute_over_arrays(sql: str, row_sets: Sequence[Sequence[tuple]]) -> None:
    """Run ``sql`` with one array parameter per column of each row set, in order, with
    server-side binding (prepared after a few runs where the connection prepares)."""
    with server_cursor() as cursor:
        cursor.execute(sql, [list(column) for rows in row_sets
                             for column in zip(*rows, strict=True)])


class PostgreSQL(Backend):
    vendor = "postgresql"
    placeholder = "%s"
    # A subscriber's ACK (and so its next NOTIFY) then never waits for a publish transaction
    # that is committing: the two run side by side.
    acks_apart = True

    def db_datetime(self, value: datetime | None) -> Any:
        return value

    def query(self, sql: str, params: Sequence[Any]) -> Rows:
        db = connections[DEFAULT_DB_ALIAS]
        db.ensure_connection()
        cursor = db.connection.cursor()
        cursor.execute(sql, params)

        def read() -> list[tuple]:
            with closing(cursor):
                return cursor.fetchall()

        return read

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def hot_transaction(self, relaxed: bool) -> Iterator[None]:
        db = connections[DEFAULT_DB_ALIAS]
        if db.in_atomic_block or not db.get_autocommit():  # a caller's transaction
            with transaction.atomic():
                if relaxed:
                    with db.cursor() as cursor:
                        cursor.execute("SET LOCAL synchronous_commit = off")
                yield
            return
        with transaction.atomic(), _pipelined(db, relaxed):
            yield

    def lock_topics(self, topic_ids: list[int], exclusive: bool) -> None:
        function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        with server_cursor() as cursor:
            cursor.execute(f"SELECT {function}({TOPIC_LOCK_SPACE}, (t %% 2147483647)::int4) "
                           f"FROM unnest(%s::bigint[]) AS u(t)", [topic_ids])

    # ------------------------------------------------------------------ inserts

    def _unnest_sql(self, table: Table, with_pk: bool) -> str:
        """One statement however many rows, one array per column, in binary: no SQL text
        built per row, one plan."""

        def build() -> str:
            db = connections[DEFAULT_DB_ALIAS]
            meta = table.model._meta
            fields = [meta.get_field(f) for f in table.fields]
            if with_pk:
                fields.insert(0, meta.pk)
            types = [f.rel_db_type(db) if f.is_relation else f.db_type(db) for f in fields]
            # JSON goes as text (db_json) and becomes jsonb in the SELECT.
            arrays = ", ".join(f"%b::{'text' if t == 'jsonb' else t}[]" for t in types)
            values = ", ".join(f"c{i}::jsonb" if t == "jsonb" else f"c{i}"
                               for i, t in enumerate(types))
            names = ", ".join(f"c{i}" for i in range(len(types)))
            qn = db.ops.quote_name
            return (f"INSERT INTO {qn(meta.db_table)} "
                    f"({', '.join(qn(f.column) for f in fields)}) "
                    f"SELECT {values} FROM unnest({arrays}) AS u({names})")

        return table.statement(("unnest", with_pk), build)

    def insert(self, table: Table, rows: Sequence[tuple], with_pk: bool) -> None:
        _execute_over_arrays(self._unnest_sql(table, with_pk), [rows])

    def reserve_pks(self, table: Table, count: int) -> Callable[[], list[int]]:
        meta = table.model._meta
        read = self.query("SELECT nextval(pg_get_serial_sequence(%s, %s)) "
                          "FROM generate_series(1, %s)", (meta.db_table, meta.pk.column, count))
        return lambda: sorted(pk for (pk,) in read())

    def insert_returning_pks(self, table: Table, rows: Sequence[tuple],
                             reserved: Callable[[], list[int]] | None,
                             into: Inserts | None) -> list[int]:
        # Keys taken from the sequence first: one round trip for them (shared with whatever
        # the caller asked for with them), and the rows go out pipelined.
        pks = (reserved or self.reserve_pks(table, len(rows)))()
        keyed = [(pk, *row) for pk, row in zip(pks, rows, strict=True)]
        if into is not None:
            into.add(table, keyed, with_pk=True)
        else:
            self.insert(table, keyed, True)
        return pks

    def add_insert(self, into: Inserts, table: Table, rows: Sequence[tuple],
                   with_pk: bool) -> None:
        into.parts.append((table, rows, with_pk))

    def run_inserts(self, parts: list[tuple[Table, Sequence[tuple], bool]]) -> None:
        if len(parts) == 1:
            table, rows, with_pk = parts[0]
            self.insert(table, rows, with_pk)
            return
        key = tuple((id(table), with_pk) for table, _, with_pk in parts)
        sql = _GROUPED.get(key)
        if sql is None:
            clauses = [self._unnest_sql(table, with_pk) for table, _, with_pk in parts]
            sql = _GROUPED[key] = "WITH " + ", ".join(
                f"p{i} AS ({clause})" for i, clause in enumerate(clauses[:-1])
            ) + " " + clauses[-1]
        _execute_over_arrays(sql, [rows for _, rows, _ in parts])

    # ------------------------------------------------------------------ ACKs

    def record_acks(self, acks: Sequence[Ack], now: datetime, *,
                    returning: bool) -> Callable[[], list[int]] | None:
        if returning:
            return record_acks_each(acks, now, returning=True)
        # One statement for the batch (one upsert per ACK, parsed and planned each, would be
        # most of the server's work), the first ACK of each (account, smuid) pair only (a
        # pair twice in one statement would be an error).
        firsts: dict[tuple[int, int], int] = {}
        for ack in acks:
            firsts.setdefault((ack.account_id, ack.smuid), ack.attempts)
        with server_cursor() as cursor:
            cursor.execute(
                acked_upsert(
                    f"SELECT a.account_id, m.id, %s, a.attempts, %s, %s, NULL, %s "
                    f"FROM unnest(%s::bigint[], %s::bigint[], %s::integer[]) "
                    f"AS a(account_id, message_id, attempts) "
                    f"JOIN {Message._meta.db_table} m ON m.id = a.message_id "
                    f"WHERE EXISTS (SELECT 1 FROM {Account._meta.db_table} "
                    f"WHERE id = a.account_id)"),
                [Delivery.State.ACKED.value, now, now, now, [a for a, _ in firsts],
                 [m for _, m in firsts], list(firsts.values())],
                prepare=False)  # a join: see execute_unprepared
        return None

    def finish_messages(self, message_ids: list[int], now: datetime) -> None:
        """One UPDATE that decides it itself, so nothing is read back (inside a hot
        transaction it leaves with the COMMIT)."""
        execute_unprepared(finish_statements(message_ids, now))

    # ------------------------------------------------------------------ queue-mode locks

    def lock_deliveries(self, account_id: int, holder: str, smuids: Sequence[int],
                        now: datetime, deadline: datetime, max_retries: int) -> Rows:
        """The candidate rows are chosen with ``FOR UPDATE SKIP LOCKED``, then locked to
        ``holder``. A plain conditional UPDATE waits for a row another transaction changes
        (a competing take in another process's settle batch), then re-checks it: takers
        queue behind each other's commits, and two batches taking the same rows in another
        order deadlock, one of them failing. A row held by another transaction is that
        taker's (or its holder's ACK, or a release being decided): passed by here, as a take
        that lost. ``FOR UPDATE`` checks the conditions on the newest committed version of
        each row it locks, so exactly one take wins a row, as before. Materialized: the
        candidates are chosen (and locked) once, whatever the plan. The outer UPDATE finds
        the rows by the (account, message) index, as the plain statement does."""
        table = Delivery._meta.db_table
        params = lock_params(account_id, holder, smuids, now, deadline, max_retries)
        return self.query(
            f"WITH c AS MATERIALIZED (SELECT d.id FROM {table} d "
            f"WHERE {lock_conditions('d', '%s', len(smuids))} FOR UPDATE OF d SKIP LOCKED) "
            f"UPDATE {table} SET {LOCK_SET.format(ph='%s')} "
            f"WHERE {table}.account_id = %s AND {table}.message_id IN ({marks('%s', len(smuids))}) "
            f"AND {table}.id IN (SELECT id FROM c) RETURNING message_id, attempts",
            [*params[4:], *params[:4], account_id, *smuids])

    # ------------------------------------------------------------------ storage processes

    def storage_processes_possible(self) -> bool:
        return True

    def flushes_behind(self) -> bool:
        return False

    def open_for_storage(self, database: str) -> str | None:
        if settings.SMQP_PG_PREPARED_STATEMENTS:
            # This connection runs the same few INSERTs over arrays again and again (a
            # publish batch's rows, the usage events): psycopg prepares each after five
            # runs, and PostgreSQL then neither parses nor plans it each time (its generic
            # plan is the one plan an INSERT from unnest() has). Statements that find rows
            # stay unprepared (execute_unprepared). Django leaves this off by default.
            options = connection.settings_dict.setdefault("OPTIONS", {})
            options.setdefault("prepare_threshold", 5)
        # Django's health check sends a SELECT 1 before every call: a round trip more per
        # publish batch. before_storage_call() does its work without one.
        connection.settings_dict["CONN_HEALTH_CHECKS"] = False
        connection.close()  # the next use connects with these settings
        return None

    def before_storage_call(self) -> None:
        # A server that ended the connection while it sat idle (a restart, a failover,
        # pg_terminate_backend) has said so on the socket, which nothing else makes readable
        # between two calls: only then is the connection tried (SELECT 1), and replaced. Not
        # while a publish batch is held open before its COMMIT (a failure shows there).
        raw = connection.connection
        if raw is None or raw.closed or connection.in_atomic_block:
            return
        if select.select([raw.fileno()], [], [], 0)[0] and not connection.is_usable():
            connection.close()

    def connection_broken(self) -> bool:
        raw = connection.connection
        return raw is not None and raw.broken

    def keep_statistics(self) -> None:
        """ANALYZE the message and delivery tables once their rows changed by more than
        :data:`STALE_ROWS` plus :data:`STALE_FRACTION` of them since the last ANALYZE (a
        look every :data:`STATISTICS_EVERY` seconds at most). A burst of publishes into a
        new or small table otherwise leaves the planner estimating one row per account and
        state until autovacuum comes round (a minute or more, per database): it then joins
        each pending delivery to every pending message of its topic, and a REST pull of
        3,500 waiting messages took 6 s instead of milliseconds. One storage process at a
        time does it (an advisory lock); ANALYZE samples, and blocks no reads or writes.

        The look is a query on this connection; the ANALYZE runs on a thread of its own
        (:func:`_analyze`): it takes tens of milliseconds and more on a large table, and the
        publishes sent to this process meanwhile waited for it on this connection (publish
        benchmark: confirm p99 179-184 ms, 36 ms without it)."""
        global _next_look, _analyzing
        now = time.monotonic()
        if now < _next_look or (_analyzing is not None and _analyzing.is_alive()):
            return
        _next_look = now + STATISTICS_EVERY
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(%s) "
                "AND n_mod_since_analyze > %s + %s * n_live_tup",
                [list(_GROWING), STALE_ROWS, STALE_FRACTION])
            stale = [name for name, in cursor.fetchall()]
        if stale:
            _analyzing = threading.Thread(target=_analyze, args=(stale,),
                                          name="smqp-analyze", daemon=True)
            _analyzing.start()


def _analyze(tables: list[str]) -> None:
    """ANALYZE ``tables`` unless another storage process is at it, on this thread's own
    connection, closed afterwards (no connection is kept for the seconds between)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_ANALYZE_LOCK])
            if cursor.fetchone()[0]:
                cursor.execute("ANALYZE " + ", ".join(tables))
    except Exception:
        logger.warning("keeping the planner's statistics failed", exc_info=True)
    finally:
        connection.close()


def analyzed(timeout: float | None = None) -> None:
    """Returns once the ANALYZE :meth:`PostgreSQL.keep_statistics` started has ended."""
    if _analyzing is not None:
        _analyzing.join(timeout)


#: The tables publishes and ACKs grow and change by the thousand.
_GROWING = (Message._meta.db_table, Delivery._meta.db_table)
STATISTICS_EVERY = 1.0
STALE_ROWS = 200
STALE_FRACTION = 0.1
_ANALYZE_LOCK = 0x534D5150_01  # "SMQP", 1
_next_look = 0.0
_analyzing: threading.Thread | None = None

#: :meth:`PostgreSQL.run_inserts`' statements, by the tables (and keys) of their parts.
_GROUPED: dict[tuple[tuple[int, bool], ...], str] = {}


@contextmanager
def _pipelined(db: Any, relaxed: bool) -> Iterator[None]:
    """The body of a hot transaction outside any caller's: inside Django's ``atomic()``,
    which keeps Django's books (``on_commit`` hooks wait for the COMMIT and are dropped on a
    rollback, an ``atomic()`` inside nests, an error rolls back, the connection is in
    autocommit again afterwards), the transaction itself is sent by hand, pipelined.

    ``atomic()`` turned the driver's autocommit off, so psycopg would send a BEGIN of its
    own before the first statement and wait for it (in pipeline mode it syncs after it): a
    round trip more per transaction. The driver's autocommit is therefore set back on (a
    psycopg setting, no round trip) and the BEGIN goes out with the statements. Django's
    COMMIT at the end of ``atomic()`` then finds no transaction open and sends nothing; its
    ROLLBACK after a failure finds the failed one and ends it. What is written here is
    public API of the two libraries: Django's state is left to ``atomic()``."""
    raw = db.connection
    raw.autocommit = True
    commit_sent = False
    try:
        with db.wrap_database_errors, raw.pipeline():  # Django's exceptions
            raw.execute("BEGIN")
            if relaxed:
                raw.execute("SET LOCAL synchronous_commit = off")
            yield
            if transaction.get_rollback():  # an error was caught inside: never commit
                raise transaction.TransactionManagementError(
                    "an error inside the transaction left it unusable")
            raw.execute("COMMIT")
            commit_sent = True  # queued: it leaves with the pipeline's last sync
    except BaseException as exc:
        # A lost connection (psycopg closes a broken one) is dropped by atomic(); before the
        # COMMIT went out nothing was committed, and the caller may run it again.
        if not commit_sent and raw.broken:
            raise Unsent("the database connection was lost") from exc
        raise


def finish_statements(message_ids: list[int], now: datetime) -> list[Statement]:
    """The rule of :meth:`PostgreSQL.finish_messages` as one UPDATE that reads nothing back.
    Each message's deliveries are looked at once (open: neither ACKed nor dead; dead), then
    a message open for no one goes to Trash if it is dead for someone (and still waiting),
    else its timeout starts (none for a state message or no timeout). One UPDATE, not one
    for each case: two would each look at the deliveries.

    The batch's ids are the only condition on the message an index may serve: the others
    are ``IS TRUE`` tests, which no index matches, so the plan reads these messages by their
    primary key whatever the statistics say. With ``m.state = 'pending'`` as a plain
    condition, statistics taken while few messages waited (or none: a young table, or no
    autovacuum) made the planner read every waiting message through the topic index and
    filter the ids out of them."""
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
