"""The database backends: what differs between SQLite and PostgreSQL, behind one interface.

The store's modules (:mod:`..rows`, :mod:`..messages`, :mod:`..dbthread`, the storage
processes) say what they need done; :func:`backend` answers with the one backend this process
uses, chosen once from the configured database's vendor. Nothing above the store asks which
database it is.

- :mod:`.sqlite`: one writer, no round trips to save; statements run and are read at once.
- :mod:`.postgresql`: round trips are what costs; statements go pipelined, rows as binary
  arrays, and a few statements carry a rule that SQLite applies in Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from django.db import DEFAULT_DB_ALIAS, connections

if TYPE_CHECKING:
    from ..rows import Inserts, Table

class Unsent(Exception):
    """The connection broke before the transaction's COMMIT went out (the database restarted
    while the connection sat idle, say): nothing of it was committed, so it may run again on
    a new connection (:func:`broker.store.dbthread.call_here` does, once)."""


#: A statement and its parameters.
Statement = tuple[str, Sequence[Any]]
#: Rows of a statement already sent: calling it waits for them (see :meth:`Backend.query`).
Rows = Callable[[], list[tuple]]


class Ack(Protocol):
    """What the store reads of an ACK (the services' ``AckRequest``)."""

    account_id: int
    smuid: int
    attempts: int


class Backend(ABC):
    """One database vendor's way of running the store's statements."""

    #: Django's name of the vendor (``connection.vendor``).
    vendor: ClassVar[str]
    #: The DB-API parameter mark of its driver.
    placeholder: ClassVar[str]
    #: Do ACK batches commit on a connection (thread, storage process) of their own, side by
    #: side with publishes? Not where a second writer would only wait for the first.
    acks_apart: ClassVar[bool]

    # ------------------------------------------------------------------ values and reads

    @abstractmethod
    def db_datetime(self, value: datetime | None) -> Any:
        """A datetime as the driver takes it for a column, in the form Django writes."""

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any]) -> Rows:
        """Run ``sql`` now; the returned function gives its rows (possibly only then waiting
        for them: send every statement whose rows you need, then read)."""

    # ------------------------------------------------------------------ transactions

    @abstractmethod
    def hot_transaction(self, relaxed: bool) -> AbstractContextManager[None]:
        """The transaction of a publish or ACK batch (see :func:`..rows.hot_transaction`);
        ``relaxed``: commit without waiting for the disk."""

    @abstractmethod
    def lock_topics(self, topic_ids: list[int], exclusive: bool) -> None:
        """Make a publish batch and a new subscription on the same topics see each other
        (sorted ``topic_ids``; see :func:`..rows.lock_topics`)."""

    # ------------------------------------------------------------------ inserts

    @abstractmethod
    def insert(self, table: Table, rows: Sequence[tuple], with_pk: bool) -> None:
        """INSERT ``rows`` into ``table`` now (``with_pk``: each row starts with its key)."""

    @abstractmethod
    def reserve_pks(self, table: Table, count: int) -> Callable[[], list[int]] | None:
        """Ask for ``count`` new keys of ``table`` now, read later; None where the INSERTs
        themselves give them."""

    @abstractmethod
    def insert_returning_pks(self, table: Table, rows: Sequence[tuple],
                             reserved: Callable[[], list[int]] | None,
                             into: Inserts | None) -> list[int]:
        """INSERT ``rows`` (now, or with ``into``); their new keys, ascending in row order."""

    @abstractmethod
    def add_insert(self, into: Inserts, table: Table, rows: Sequence[tuple],
                   with_pk: bool) -> None:
        """``rows`` for ``table`` as part of ``into``: inserted now, or kept for
        :meth:`run_inserts`."""

    @abstractmethod
    def run_inserts(self, parts: list[tuple[Table, Sequence[tuple], bool]]) -> None:
        """The INSERTs :meth:`add_insert` kept, (table, rows, with_pk) each."""

    # ------------------------------------------------------------------ ACKs

    @abstractmethod
    def record_acks(self, acks: Sequence[Ack], now: datetime, *,
                    returning: bool) -> Callable[[], list[int]] | None:
        """The deliveries of ``acks`` become ACKed (see :func:`..messages.record_acks`); with
        ``returning``, a function giving the smuids ACKed for the first time."""

    # ------------------------------------------------------------------ queue-mode locks

    @abstractmethod
    def lock_deliveries(self, account_id: int, holder: str, smuids: Sequence[int],
                        now: datetime, deadline: datetime, max_retries: int) -> Rows:
        """Lock these deliveries of the account to ``holder`` where each row's conditions
        allow (see :func:`..messages.lock_deliveries`); rows (message_id, attempts) of those
        locked, read by calling the result."""

    @abstractmethod
    def finish_messages(self, message_ids: list[int], now: datetime) -> None:
        """Messages open for no one start their timeout, or go to Trash when they are dead
        for someone (see :func:`..messages.finish_messages`)."""

    # ------------------------------------------------------------------ storage processes

    @abstractmethod
    def storage_processes_possible(self) -> bool:
        """Can another process open this database (not an in-memory one)?"""

    @abstractmethod
    def flushes_behind(self) -> bool:
        """Does a storage process commit without waiting for the disk and flush the log
        itself before it answers (see :mod:`..worker`)?"""

    @abstractmethod
    def open_for_storage(self, database: str) -> str | None:
        """Set up a storage process's connection to ``database``; returns the file whose
        flush makes its commits durable when :meth:`flushes_behind`, else None."""

    @abstractmethod
    def keep_statistics(self) -> None:
        """Between a storage process's calls: bring the planner's statistics of the tables
        publishes grow up to date when they are far behind."""

    @abstractmethod
    def before_storage_call(self) -> None:
        """In a storage process, before each call: replace a connection that can no longer
        serve it, where that is known without a round trip."""

    @abstractmethod
    def connection_broken(self) -> bool:
        """Has the current connection been found broken (the server ended it)?"""


# ---------------------------------------------------------------------- shared helpers


@contextmanager
def raw_cursor() -> Iterator[Any]:
    """The DB-API cursor of the current connection (its transaction is the caller's)."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with closing(db.connection.cursor()) as cursor:
        yield cursor


def marks(placeholder: str, count: int) -> str:
    """``count`` parameter marks, comma-separated (an ``IN (...)`` list)."""
    return ", ".join([placeholder] * count)


_chosen: Backend | None = None


def backend() -> Backend:
    """The backend of this process's database, chosen once (its vendor does not change)."""
    chosen = _chosen
    if chosen is None:
        chosen = _choose()
    return chosen


def _choose() -> Backend:
    global _chosen
    vendor = connections[DEFAULT_DB_ALIAS].vendor
    if vendor == "postgresql":
        from .postgresql import PostgreSQL

        _chosen = PostgreSQL()
    elif vendor == "sqlite":
        from .sqlite import SQLite

        _chosen = SQLite()
    else:
        raise RuntimeError(f"the broker runs on SQLite or PostgreSQL, not {vendor}")
    return _chosen
