"""The listener's database connections are cut (the database restarted, a proxy dropped
them): the next publishes and ACKs go through on new connections, over a real socket, with
no error reply and nothing lost or delivered twice.

On PostgreSQL the storage processes skip Django's per-call health check (a round trip per
publish batch): a connection the server ended while it sat idle is found on its socket and
replaced before the next call, and one found broken before a transaction's COMMIT went out is
replaced and the transaction run once more. Here every server-side connection to the
listener's database is terminated between two messages.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.conftest import PG_ADMIN_URL, fresh_listener
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


def _terminate_connections(database: str) -> int:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall()
    return len(rows)


def _wait_acked(database: str, count: int) -> None:
    """Until ``count`` ACKs are in the database: 310 ACK goes once the ACK is journaled, and
    its batch follows; a cut while that batch is on its way would be another test (a batch
    that fails mid-transaction is retried, and logged)."""
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
    deadline = time.monotonic() + scaled(10)
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            (acked,) = conn.execute(
                "SELECT count(*) FROM broker_delivery WHERE state = 'acked'").fetchone()
            if acked >= count:
                return
            time.sleep(0.02)
    raise AssertionError(f"{count} ACKs did not reach the database")


def test_publish_and_ack_survive_cut_database_connections(tmp_path):
    with fresh_listener("postgres", tmp_path) as broker:
        database = broker.env["DATABASE_URL"].rsplit("/", 1)[1]
        with Session(broker.host, broker.port, "root") as sub, \
                Session(broker.host, broker.port, "root") as pub:
            assert pub.command("CREATE TOPIC /cut").code == 200
            assert sub.command("SUB MESSAGE /cut").code == 200
            first = smuid_of(pub.publish("/cut", "C0"))
            assert header(sub.message(), "Smuid").endswith(f"/{first}")
            sub.ack()
            smuids = [first]
            for round_ in range(2):
                # The publish and the ACK connection (and any other) are cut while idle.
                _wait_acked(database, len(smuids))
                assert _terminate_connections(database) >= 1
                reply = pub.publish("/cut", f"C{round_ + 1}")
                assert reply.code == 200, reply
                smuids.append(smuid_of(reply))
                assert header(sub.message(), "Smuid").endswith(f"/{smuids[-1]}")
                sub.ack()  # the server's 310 ACK: recorded, on a new connection
            # Each message once: nothing more is waiting for this subscriber.
            assert sub.command("NOOP").code == 200
            assert not sub.pending
    log = broker.log_path.read_text()
    assert "publish batch" not in log and "ack batch" not in log  # no failed batch


def _allow_connections(database: str, allow: bool) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allow).lower()}')


def test_logins_the_database_outage_left_undecided_do_not_lock_the_account_out(tmp_path):
    """Logins during a database outage get an error: their password checks raise. They are
    not failed logins: once the database is back the account logs in at once, where counted
    as failures they had locked it out (lockout here after 3)."""
    limits = {"SMQP_LOGIN_FAILURES_BEFORE_DELAY": "2", "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "3"}
    with fresh_listener("postgres", tmp_path, limits) as broker:
        database = broker.env["DATABASE_URL"].rsplit("/", 1)[1]
        with Session(broker.host, broker.port, "bob"):
            pass
        _allow_connections(database, False)
        try:
            _terminate_connections(database)
            codes = []
            for _ in range(6):
                with Session(broker.host, broker.port) as s:
                    assert s.command("LOGIN bob CLEAR/1.0").code == 200
                    codes.append(s.command("PASS bob pw").code)
        finally:
            _allow_connections(database, True)
        assert all(code >= 500 for code in codes), codes
        assert "command Pass failed" in broker.log_path.read_text()
        with Session(broker.host, broker.port, "bob") as bob:  # neither refused nor delayed
            assert bob.command("NOOP").code == 200
