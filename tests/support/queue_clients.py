"""Helpers of the queue-mode end-to-end tests: a 310 ACK whose answer may be a refusal, who
got a notification first, and the store's rows read directly (no Django in the test
process's way, no ``manage.py shell`` start-up while a lock's deadline runs)."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing

from broker.smqp.client import Reply, ServerAck
from tests.support.smqp_session import Session, header
from tests.support.timing import scaled


def ack_answer(session: Session, smuid: int | None = None) -> int:
    """Send ``310 ACK`` (``310 ACK <smuid>`` with ``smuid``); the server's answer: 310, or
    the code of its refusal (409)."""
    line = b"310 ACK\r\n" if smuid is None else f"310 ACK {smuid}\r\n".encode()
    session.sock.sendall(line)
    while True:
        event = session._next()
        if isinstance(event, ServerAck):
            return 310
        if isinstance(event, Reply):
            return event.code
        session.pending.append(event)


def smuid_in(note) -> int:
    return int(header(note, "Smuid").rsplit("/", 1)[1])


def first_notified(sessions: dict[str, Session], timeout: float = 10.0) -> tuple[str, int]:
    """(name, smuid) of the first of ``sessions`` to get a NOTIFY MESSAGE."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        for name, session in sessions.items():
            if not session.quiet(0.1):
                return name, smuid_in(session.message())
    raise AssertionError("no session got the message")


def store_rows(env: dict[str, str], sql: str) -> list[tuple]:
    """Rows of ``sql`` (no parameters) on the database of ``env``."""
    url = env["DATABASE_URL"]
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=scaled(30))) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def deliveries_of(env: dict[str, str], smuid: int) -> list[tuple[str, str, str, int]]:
    """(account, state, holder, attempts) of every delivery row of message ``smuid``."""
    return store_rows(env, (
        "SELECT a.username, d.state, d.holder, d.attempts FROM broker_delivery d "
        f"JOIN accounts_account a ON a.id = d.account_id WHERE d.message_id = {int(smuid)} "
        "ORDER BY a.username"))
