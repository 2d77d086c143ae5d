"""Backlogs and replies longer than a session reads at once, and late subscribers, over real
sockets.

The listener here reads a backlog ``SMQP_BACKLOG_PAGE`` = 4 messages at a time and writes a
GET MESSAGE reply ``SMQP_GET_PAGE`` = 4 messages at a time, so a dozen messages take several
pages: every one must still arrive, once, in priority-then-publish order, with live messages
published meanwhile after the older ones of the same priority; a reply in parts is never
split by a notification.
"""

from __future__ import annotations

import pytest

from tests.conftest import fresh_listener
from tests.support.smqp_client import RawClient
from tests.support.smqp_session import Session, header, smuid_of

pytestmark = pytest.mark.e2e

PAGE = 4

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for path in ['/p', '/p/long', '/p/late', '/p/queue', '/p/get', '/p/live']:
    ts.create_topic(snap, path)
Topic.objects.filter(path='/p/queue').update(delivery_mode='queue')
p = Topic.objects.get(path='/p')
for name in ['bob', 'alice']:
    a = Account.objects.get(username=name)
    for right in ['subscribe', 'publish']:
        UALEntry.objects.create(topic=p, principal_kind='account', account=a, right=right)
from topics import tree
tree.changed()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"backlog-{request.param}")
    with fresh_listener(request.param, base, {"SMQP_BACKLOG_PAGE": str(PAGE),
                                                   "SMQP_GET_PAGE": str(PAGE)},
                        setup=SETUP) as b:
        yield b


def session(broker, user: str = "root") -> Session:
    return Session(broker.host, broker.port, user)


def body(note) -> str:
    return note.message.sections[0].body.decode()


def receive(s: Session, count: int) -> list[str]:
    got = []
    for _ in range(count):
        got.append(body(s.message()))
        s.ack()
    return got


def test_a_backlog_of_several_pages_arrives_whole_in_order_with_live_messages_after(broker):
    with session(broker, "bob") as bob:
        assert bob.command("SUB MESSAGE /p/long").code == 200
    # Three pages and a bit while bob is away: priority 1 first, then publish order.
    plan = [(f"m{i}", "1" if i % 4 == 3 else None) for i in range(13)]
    with session(broker) as pub:
        for cmuid, pri in plan:
            assert pub.publish("/p/long", cmuid, [("Priority", pri)] if pri else []).code == 200
    urgent = [c for c, p in plan if p]
    rest = [c for c, p in plan if not p]
    with session(broker, "bob") as bob, session(broker) as pub:
        got = receive(bob, 3)
        # Published while bob works through the first page: after every older message.
        for cmuid in ("live1", "live2"):
            assert pub.publish("/p/long", cmuid).code == 200
        got += receive(bob, len(plan) + 2 - 3)
        assert bob.quiet(1.0)
    assert got == urgent + rest + ["live1", "live2"]
    with session(broker, "bob") as bob:  # all ACKed: nothing comes back
        assert bob.quiet(1.0)
        assert bob.command("UNSUB MESSAGE /p/long").code == 200


def test_a_slow_subscriber_holds_a_page_in_memory_and_still_gets_everything_in_order(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /p/long").code == 200
        first = smuid_of(pub.publish("/p/long", "s0"))
        assert header(bob.message(), "Smuid").endswith(f"/{first}")
        # bob holds s0 un-ACKed while three pages' worth arrive live, some urgent.
        plan = [(f"s{i}", "2" if i % 5 == 0 else None) for i in range(1, 3 * PAGE + 2)]
        for cmuid, pri in plan:
            assert pub.publish("/p/long", cmuid, [("Priority", pri)] if pri else []).code == 200
        bob.ack()
        got = receive(bob, len(plan))
        assert bob.quiet(1.0)
        assert bob.command("UNSUB MESSAGE /p/long").code == 200
    assert got == [c for c, p in plan if p] + [c for c, p in plan if not p]


def test_a_late_subscriber_gets_every_held_message_page_by_page(broker):
    with session(broker) as pub:
        sent = [smuid_of(pub.publish("/p/late", f"h{i}")) for i in range(3 * PAGE + 1)]
    with session(broker, "alice") as alice:
        assert alice.command("SUB MESSAGE /p/late").code == 200
        smuids = []
        for _ in sent:
            note = alice.message()
            smuids.append(int(header(note, "Smuid").rsplit("/", 1)[1]))
            alice.ack()
        assert alice.quiet(1.0)
        assert smuids == sent
        assert alice.command("UNSUB MESSAGE /p/late").code == 200


def test_a_late_subscriber_to_a_queue_gets_no_message_another_one_holds(broker):
    with session(broker) as pub:
        unassigned = smuid_of(pub.publish("/p/queue", "U1"))  # nobody subscribed yet
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /p/queue").code == 200
        note = bob.message()
        assert header(note, "Smuid").endswith(f"/{unassigned}")
        bob.ack()
        held = [smuid_of(pub.publish("/p/queue", f"Q{i}")) for i in range(2)]
        acked = []
        for _ in held:
            acked.append(int(header(bob.message(), "Smuid").rsplit("/", 1)[1]))
            bob.ack()
        assert acked == held
        with session(broker, "alice") as alice:
            # U1, Q0 and Q1 are bob's: none of them goes to alice as well.
            assert alice.command("SUB MESSAGE /p/queue").code == 200
            assert alice.quiet(1.5)
            assert alice.command("UNSUB MESSAGE /p/queue").code == 200
        assert bob.command("UNSUB MESSAGE /p/queue").code == 200


def test_a_get_reply_of_many_pages_is_whole_and_no_notification_splits_it(broker):
    with session(broker) as pub:
        stored = [smuid_of(pub.publish("/p/get", f"G{i}")) for i in range(7 * PAGE + 2)]
        waiting = smuid_of(pub.publish("/p/live", "L1"))
    with RawClient(broker.host, broker.port) as bob:
        bob.login("bob", "pw")
        # The subscription's backlog (L1) is ready to go while the GET reply is written in
        # pages: its NOTIFY must wait for the reply's last line.
        bob.send(b"SUB MESSAGE /p/live\r\nGET MESSAGE /p/get *\r\n")
        lines: list[bytes] = []
        end = f"200 {len(stored)} messages\r\n".encode()
        while end not in lines or not any(x.startswith(b"NOTIFY MESSAGE") for x in lines):
            line = bob.read_line()
            assert line, lines
            lines.append(line)
        start = lines.index(b"200 /p/live\r\n") + 1
        while lines[start].startswith(b"NOTIFY") or lines[start - 1].startswith(b"NOTIFY"):
            start = lines.index(b".\r\n", start) + 1  # a NOTIFY before the reply began
        reply = lines[start:lines.index(end) + 1]
        assert reply[0] == b"200-OK\r\n", lines
        assert not any(x.startswith(b"NOTIFY") for x in reply), reply
        bodies = [x.strip().decode() for x in reply if x.startswith(b"G")]
        assert bodies == [f"G{i}" for i in range(len(stored))]
        assert sum(x.startswith(b"Smuid:") for x in reply) == len(stored)
    with session(broker, "bob") as bob:  # the same through the client codec, and L1 again
        got = bob.command("GET MESSAGE /p/get *")
        assert got.lines[-1] == f"{len(stored)} messages"
        assert [m.sections[0].body.decode() for m in got.messages] == bodies
        assert header(bob.message(), "Smuid").endswith(f"/{waiting}")
        bob.ack()
        assert bob.command("UNSUB MESSAGE /p/live").code == 200
