"""Issue 34 item 13 over real sockets (SQLite and PostgreSQL): a subscriber with a backlog
logs in, again and again, while a publisher keeps publishing to its topic, so that messages
are offered to the session both by its own backlog read and by wake-ups that come while the
login is being set up. Every time, the bytes of the whole PASS reply (``200-OK`` ...
``200 Guid: ...``) come before the first ``NOTIFY``. The consumer-level test that holds the
login open at the racy moment is unit/delivery/test_smqp_login_reply_order."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import fresh_listener
from tests.support.smqp_client import REPLY_END, RawClient
from tests.support.smqp_session import Session
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

LOGINS = 40
TOPIC = "/p/login"

SETUP = f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
ts.create_topic(snap, '/p')
ts.create_topic(snap, '{TOPIC}')
UALEntry.objects.create(topic=Topic.objects.get(path='/p'), principal_kind='account',
                        account=Account.objects.get(username='bob'), right='subscribe')
from topics import tree
tree.changed()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"order-{request.param}"),
                        setup=SETUP) as b:
        yield b


def pass_reply_then_first_line(broker) -> tuple[list[bytes], bytes]:
    """Log bob in; the lines up to the PASS reply's last one (or up to the first that is not
    one of its lines), and the line after it."""
    with RawClient(broker.host, broker.port) as c:
        c.read_line()  # greeting
        assert c.command("LOGIN bob CLEAR/1.0") == [b"200 OK\r\n"]
        c.send_line("PASS bob pw")
        lines = []
        while not lines or not REPLY_END.match(lines[-1]):
            line = c.read_line()
            assert line, f"closed after {lines!r}"
            lines.append(line)
            if not line.startswith(b"200"):  # a NOTIFY inside or before the reply
                return lines, b""
        return lines, c.read_line()


def test_the_whole_pass_reply_comes_before_the_first_notify(broker):
    with Session(broker.host, broker.port, "bob") as bob:
        assert bob.command(f"SUB MESSAGE {TOPIC}").code == 200
    stop = threading.Event()
    published = []
    failures: list[BaseException] = []

    def publish() -> None:
        try:
            with Session(broker.host, broker.port, "root") as root:
                while not stop.is_set():
                    assert root.publish(TOPIC, f"m{len(published)}").code == 200
                    published.append(1)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    with Session(broker.host, broker.port, "root") as root:
        for i in range(3):  # a backlog before the first login
            assert root.publish(TOPIC, f"b{i}").code == 200
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        for attempt in range(LOGINS):
            lines, after = pass_reply_then_first_line(broker)
            assert lines[0] == b"200-OK\r\n", (attempt, lines)
            assert all(line.startswith(b"200-") for line in lines[:-1]), (attempt, lines)
            assert lines[-1].startswith(b"200 Guid: bob"), (attempt, lines)
            assert len(lines) == 8, (attempt, lines)  # with Max-Window (profile §9.7)
            # Its backlog comes right after (unACKed, it is there for the next login too).
            assert after == f"NOTIFY MESSAGE {TOPIC}\r\n".encode(), (attempt, after)
    finally:
        stop.set()
        publisher.join(scaled(30))
    assert not failures, failures
    assert published  # the logins did race live publishes
