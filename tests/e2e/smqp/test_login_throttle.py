"""Issue 34 item 3 over real sockets: failed logins are counted per (address, account) and per
account, each attempt is counted before its password is checked, and a good login clears only
its own account's count."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.conftest import fresh_listener
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

REFUSED = b"try again later"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def throttled(request, tmp_path_factory):
    # No delays (they would only slow the test down): the lockout is what is counted here.
    env = {"SMQP_LOGIN_FAILURES_BEFORE_DELAY": "1000",
           "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "10",
           "SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT": "25"}
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"thr-{request.param}"),
                        env) as broker:
        yield broker


def client(broker, source: str = "127.0.0.1") -> RawClient:
    c = RawClient.__new__(RawClient)
    c.sock = socket.create_connection((broker.host, broker.port), timeout=scaled(10),
                                      source_address=(source, 0))
    c.buf = b""
    c.read_line()  # greeting
    return c


def attempt(c: RawClient, user: str, password: str) -> bytes:
    assert c.command(f"LOGIN {user} CLEAR/1.0") == [b"200 OK\r\n"]
    return c.command(f"PASS {user} {password}")[-1]


def test_anothers_good_login_does_not_reset_the_count(throttled):
    """Two wrong guesses for alice then a good login as bob, repeated: alice's guesses stop
    at the limit (10) all the same."""
    checked = refused = 0
    for _ in range(8):
        for _ in range(2):
            with client(throttled) as c:
                last = attempt(c, "alice", "wrong")
                assert last.startswith(b"401 "), last
                if REFUSED in last:
                    refused += 1
                else:
                    checked += 1
        with client(throttled) as c:
            assert attempt(c, "bob", "pw").startswith(b"200 Guid: ")
    assert (checked, refused) == (10, 6)


async def _parallel_guess(host: str, port: int, user: str) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    await reader.readline()
    writer.write(f"LOGIN {user} CLEAR/1.0\r\nPASS {user} wrong\r\n".encode())
    assert await reader.readline() == b"200 OK\r\n"
    last = await reader.readline()
    writer.close()
    return last


def test_parallel_guesses_are_each_counted_before_the_check(throttled):
    async def burst():
        return await asyncio.gather(*(_parallel_guess(throttled.host, throttled.port, "jtegen")
                                      for _ in range(16)))

    replies = asyncio.run(burst())
    assert all(r.startswith(b"401 ") for r in replies), replies
    assert sum(REFUSED not in r for r in replies) == 10, replies


def test_a_good_login_clears_only_its_own_count(throttled):
    """root fails 9 times, then logs in: its count is back to zero (10 more checks) — and a
    locked-out account stays locked out from this address."""
    with client(throttled) as c:
        for _ in range(9):
            assert attempt(c, "root", "wrong") == b"401 Unauthorized\r\n"
        assert attempt(c, "root", "pw").startswith(b"200 Guid: ")
    for _ in range(10):
        with client(throttled) as c:
            assert attempt(c, "root", "wrong") == b"401 Unauthorized\r\n"
    with client(throttled) as c:
        assert REFUSED in attempt(c, "root", "pw")


def test_an_account_is_refused_past_its_own_limit_from_many_addresses(throttled):
    """Guesses for one account spread over addresses (127.0.0.2 ...) meet the per-account limit
    (25 here), while each address stays below its own (10)."""
    replies = []
    for n in range(2, 6):
        for _ in range(8):
            with client(throttled, f"127.0.0.{n}") as c:
                replies.append(attempt(c, "nobody-here", "wrong"))
    assert sum(REFUSED not in r for r in replies) == 25
    # Another address and account is not affected.
    with client(throttled, "127.0.0.9") as c:
        assert attempt(c, "bob", "pw").startswith(b"200 Guid: ")
