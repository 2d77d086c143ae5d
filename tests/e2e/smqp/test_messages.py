"""Issue 4 over real sockets: publish, two-phase delivery and the rules of profile §8, on
SQLite and PostgreSQL."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import fresh_listener
from tests.support.smqp_client import RawClient
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
root = Account.objects.get(username='root')
snap = AccessSnapshot(root)
for path in ['/m', '/m/a', '/m/b', '/m/prio', '/m/multi', '/m/since', '/m/state', '/m/expiry',
             '/m/reply', '/m/receipt', '/m/limit', '/m/count', '/m/big', '/m/retry',
             '/m/queue', '/m/once', '/m/wait']:
    ts.create_topic(snap, path)
Topic.objects.filter(path='/m/limit').update(max_message_size=1000)
Topic.objects.filter(path='/m/count').update(max_message_count=2)
Topic.objects.filter(path='/m/retry').update(retry_timeout=1, max_retries=1)
Topic.objects.filter(path='/m/queue').update(delivery_mode='queue')
Topic.objects.filter(path='/m/big').update(max_message_size=20_000_000)
m = Topic.objects.get(path='/m')
for name in ['bob', 'alice', 'jtegen']:
    a = Account.objects.get(username=name)
    for right in ['subscribe', 'publish', 'reply']:
        UALEntry.objects.create(topic=m, principal_kind='account', account=a, right=right)
from topics import tree
tree.changed()  # the update() calls above send no signals
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    """The listener, started on a copy of a database the setup was made in: its caches
    hold the setup from the start."""
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"messages-{request.param}"),
                        setup=SETUP) as b:
        yield b


def session(broker, user: str = "root") -> Session:
    return Session(broker.host, broker.port, user)


# --- the draft's examples ---------------------------------------------------------------------

DRAFT_PUB = (
    b"PUB MESSAGE /m/a A004\r\n"
    b"Priority: 1\r\n"
    b"Created: D08152001T08341245Z\r\n"
    b"Receipt: yes\r\n"
    b"Name: Stock quote for IBM\r\n"
    b"Reply: NO\r\n"
    b"Timeout: 00:01:00\r\n"
    b"Depth: 1\r\n"
    b"Sequence: 34\r\n"
    b"\r\n"
    b"Content-Type: text/plain\r\n"
    # The draft says 5 for these 6 bytes; the profile reads data by length, so the length
    # must be right for the example to frame at all.
    b"Content-Length: 6\r\n"
    b"\r\n"
    b"24.567\r\n"
    b".\r\n"
)

DRAFT_PUB_TWO_SECTIONS = (
    b"PUB MESS /m/a A005\r\n"
    b"Priority: 1\r\nName: IBM Quote\r\nCreated: D08152001T08341245Z\r\nReceipt: yes\r\n"
    b"Reply: NO\r\nTimeout: 00:01:00\r\nDepth: 1\r\nSequence: 34\r\n\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n24.567\r\n"
    b"Content-Type: text/html\r\nContent-Length: 15\r\n\r\n<b>24.567</b>\r\n\r\n"
    b".\r\n"
)


def test_draft_publish_examples_byte_for_byte(broker):
    with RawClient(broker.host, broker.port) as c:
        c.login("root", "pw")
        c.send(DRAFT_PUB)
        reply = c.read_reply()
        assert reply[0] == b"200-OK\r\n"
        assert re.fullmatch(rb"200 A004 \d+\r\n", reply[1]), reply
        c.send(DRAFT_PUB_TWO_SECTIONS)
        reply2 = c.read_reply()
        assert reply2[0] == b"200-OK\r\n" and re.fullmatch(rb"200 A005 \d+\r\n", reply2[1])
        first, second = int(reply[1].split()[-1]), int(reply2[1].split()[-1])
        assert second > first
        c.send_line(f"GET MESSAGE /m/a {second}")
        block = b""
        while not block.endswith(b"200 1 messages\r\n"):
            block += c.sock.recv(65536)
    assert block.startswith(b"200-OK\r\nTopic: /m/a\r\nCreated: D08152001T08341245Z\r\n")
    assert b"Smuid: test.example.net/%d\r\nCmuid: root/root" % second in block
    assert (b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n24.567\r\n"
            b"Content-Type: text/html\r\nContent-Length: 15\r\n\r\n<b>24.567</b>\r\n\r\n.\r\n"
            in block)


def test_notify_and_ack_exchange_byte_for_byte(broker):
    with session(broker, "bob") as bob, RawClient(broker.host, broker.port) as sub:
        assert bob.command("SUB MESSAGE /m/once").code == 200
        sub.login("bob", "pw")
        with session(broker) as pub:
            smuid = smuid_of(pub.publish(
                "/m/once", "A004",
                [("Created", "D08152001T08032445Z"), ("Priority", "1"), ("Receipt", "NO")],
                [("text/plain", b"34.456")]))
        expected = (
            b"NOTIFY MESSAGE /m/once\r\n"
            b"Created: D08152001T08032445Z\r\n"
            b"Smuid: test.example.net/%d\r\n"
            b"Cmuid: root/root" % smuid
        )
        data = b""
        while not data.endswith(b"\r\n.\r\n"):
            data += sub.sock.recv(65536)
        assert data.startswith(expected), data
        assert data.endswith(b"Priority: 1\r\nReceipt: NO\r\n\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 6\r\n\r\n34.456\r\n.\r\n")
        sub.send(b"310 ACK\r\n")
        assert sub.read_line() == b"310 ACK\r\n"
        # The other live session of bob got it too; its ACK is accepted as well.
        note = bob.message()
        assert header(note, "Smuid") == f"test.example.net/{smuid}"
        bob.ack()
        assert bob.command("UNSUB MESSAGE /m/once").code == 200


def test_ack_without_a_notification_is_400(broker):
    with session(broker) as c:
        assert c.command("310 ACK").code == 400


# --- profile §8 -------------------------------------------------------------------------------


def test_backlog_priority_fifo_and_once_only(broker):
    with session(broker, "bob") as bob:
        assert bob.command("SUB MESSAGE /m/prio").code == 200
    # bob is offline: these wait for his next login.
    with session(broker) as pub:
        ids = {}
        for cmuid, pri in [("n1", None), ("p5a", "5"), ("p1", "1"), ("p5b", "5"), ("n2", None)]:
            headers = [("Priority", pri)] if pri else []
            ids[cmuid] = smuid_of(pub.publish("/m/prio", cmuid, headers))
    order = ["p1", "p5a", "p5b", "n1", "n2"]
    with session(broker, "bob") as bob:
        got = []
        for _ in range(3):
            note = bob.message()
            got.append(note.message.sections[0].body.decode())
            bob.ack()
        fourth = bob.message()  # received but never ACKed: delivered again later
        assert fourth.message.sections[0].body == b"n1"
    assert got == order[:3]
    with session(broker, "bob") as bob:
        got = []
        for _ in range(2):
            got.append(bob.message().message.sections[0].body.decode())
            bob.ack()
        assert got == ["n1", "n2"]
        assert bob.quiet(1.0)
    with session(broker, "bob") as bob:  # once-only: nothing ACKed comes back
        assert bob.quiet(1.5)
        assert bob.command("UNSUB MESSAGE /m/prio").code == 200


def test_every_live_session_gets_live_messages(broker):
    with session(broker, "alice") as s1, session(broker, "alice") as s2:
        assert s1.command("SUB MESSAGE /m/multi").code == 200
        with session(broker) as pub:
            smuid = smuid_of(pub.publish("/m/multi", "X1"))
        for s in (s1, s2):
            note = s.message()
            assert header(note, "Smuid").endswith(f"/{smuid}")
            s.ack()
        assert s1.command("UNSUB MESSAGE /m/multi").code == 200


def test_wildcard_subscription_covers_topics_created_later(broker):
    with session(broker, "bob") as bob, session(broker) as root:
        assert bob.command("SUB MESSAGE /m/b/*").lines == ["OK", "/m/b/*"]
        assert root.command("CREATE TOPIC /m/b/later").code == 200
        smuid = smuid_of(root.publish("/m/b/later", "L1"))
        note = bob.message()
        assert note.topic == "/m/b/later" and header(note, "Smuid").endswith(f"/{smuid}")
        bob.ack()
        bob.command("UNSUB MESSAGE *")


def test_since_time_in_past_and_future(broker):
    from datetime import UTC, datetime, timedelta

    from broker.smqp.values import format_datetime

    with session(broker) as pub:
        old = smuid_of(pub.publish("/m/since", "old"))
        time.sleep(0.3)
        stamp = format_datetime(datetime.now(UTC))  # between the two publishes
        time.sleep(0.3)
        new = smuid_of(pub.publish("/m/since", "new"))
    with session(broker, "jtegen") as j:
        try:
            assert j.command(f"SUB MESSAGE /m/since {stamp}").code == 200
            note = j.message()
            assert header(note, "Smuid").endswith(f"/{new}")
            j.ack()
            assert j.quiet(1.0)
            assert j.command("UNSUB MESSAGE /m/since").code == 200
            future = format_datetime(datetime.now(UTC) + timedelta(hours=1))
            assert j.command(f"SUB MESSAGE /m/since {future}").code == 200
            assert j.quiet(1.0)
        finally:
            j.command("UNSUB *")
    assert old < new


def test_get_message_forms_and_counts(broker):
    with session(broker) as pub:
        ids = [smuid_of(pub.publish("/m/b", f"G{i}")) for i in range(4)]
        one = pub.command(f"GET MESSAGE /m/b {ids[0]}")
        assert one.lines[-1] == "1 messages" and len(one.messages) == 1
        assert one.messages[0].get("Topic") == "/m/b"
        assert one.messages[0].sections[0].body == b"G0"
        listed = pub.command(f"GET MESSAGE /m/b {ids[0]},{ids[2]}-{ids[3]}")
        assert [m.sections[0].body for m in listed.messages] == [b"G0", b"G2", b"G3"]
        everything = pub.command("GET MESS /m/b *")
        assert len(everything.messages) >= 4
        assert pub.command("GET MESSAGE /m/b 999999999").lines == ["OK", "0 messages"]
        assert pub.command("GET MESSAGE /nope 1").code == 404
        assert pub.command("COUNT MESSAGE /m/b").lines[-1] == str(len(everything.messages))
        listing = pub.command("LIST MESSAGE /m/b").lines[-1]
        assert listing.startswith(f"{ids[0]}-{ids[3]}") or str(ids[0]) in listing


def test_state_message_is_kept_after_delivery(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        bob.command("SUB MESSAGE /m/state")
        smuid = smuid_of(pub.publish("/m/state", "S1", [("Timeout", "-1")]))
        bob.message()
        bob.ack()
        bob.command("UNSUB MESSAGE /m/state")
    broker.manage("shell", "--no-imports", "-c",
                  "from broker.services.sweeps import expire_messages; expire_messages()")
    with session(broker) as c:
        assert str(smuid) in c.command("LIST MESSAGE /m/state").lines[-1]


def test_timeout_starts_once_every_publish_time_subscriber_acked(broker):
    """Profile §8: the message's timeout runs from the last ACK of the subscribers that
    existed at publish time, not from the publish (nor from the first ACK)."""
    expire = ("from broker.services.sweeps import expire_messages; "
              "print('EXPIRED', expire_messages())")

    def expired() -> int:
        out = broker.manage("shell", "--no-imports", "-c", expire).stdout
        return int(out.split("EXPIRED", 1)[1].split()[0])

    def expires_of(smuid: int) -> datetime:
        out = broker.manage("shell", "--no-imports", "-c", (
            "from broker.models import Message; "
            f"print('EXPIRES', Message.objects.get(pk={smuid}).expires.isoformat())")).stdout
        return datetime.fromisoformat(out.split("EXPIRES", 1)[1].split()[0])

    with session(broker, "bob") as bob, session(broker, "alice") as alice, \
            session(broker) as pub:
        assert bob.command("SUB MESSAGE /m/wait").code == 200
        assert alice.command("SUB MESSAGE /m/wait").code == 200
        smuid = smuid_of(pub.publish("/m/wait", "W1", [("Timeout", "00:00:01")]))
        assert header(bob.message(), "Smuid").endswith(f"/{smuid}")
        bob.ack()
        note = alice.message()  # delivered, not yet ACKed
        time.sleep(scaled(1.3))
        assert expired() == 0  # alice has not ACKed: no timeout is running
        assert str(smuid) in pub.command("LIST MESSAGE /m/wait").lines[-1]
        assert header(note, "Smuid").endswith(f"/{smuid}")
        before = datetime.now(UTC)
        alice.ack()
        # The timeout starts now: its end is a second after this ACK, not after bob's. (Read
        # rather than swept: a sweep's own start-up may take longer than that second.)
        assert expires_of(smuid) >= before + timedelta(seconds=1)
        time.sleep(scaled(1.3))
        assert expired() == 1
        assert pub.command("LIST MESSAGE /m/wait").lines[-1] == "none"
        assert str(smuid) in pub.command("LIST MESSAGE /m/wait/Trash").lines[-1]
        bob.command("UNSUB *")
        alice.command("UNSUB *")


def test_expiry_into_trash_and_republish(broker):
    with session(broker) as pub:
        plain = smuid_of(pub.publish("/m/expiry", "T1", [("Timeout", "00:00:01")]))
        seq = smuid_of(pub.publish("/m/expiry", "T2", [("Timeout", "00:00:01"),
                                                       ("Sequence", "7")]))
        assert pub.command(f"REPUB MESS /m/expiry {plain}").code == 406  # not in Trash yet
    time.sleep(scaled(1.2))
    broker.manage("shell", "--no-imports", "-c",
                  "from broker.services.sweeps import expire_messages; expire_messages()")
    with session(broker, "bob") as bob, session(broker) as pub:
        trash = pub.command("LIST MESSAGE /m/expiry/Trash").lines[-1]
        assert str(plain) in trash and str(seq) in trash
        assert pub.command("LIST MESSAGE /m/expiry").lines[-1] == "none"
        assert bob.command("SUB MESSAGE /m/expiry").code == 200
        assert pub.command(f"REPUBLISH MESSAGE /m/expiry {plain}").lines == ["OK"]
        note = bob.message()
        assert header(note, "Smuid").endswith(f"/{plain}")
        bob.ack()
        assert pub.command(f"REPUB MESS /m/expiry {seq}").code == 406  # sequenced
        assert pub.command("REPUB MESS /m/expiry 999999").code == 406  # no such message
        assert pub.command("REPUB MESS /nope 1").code == 404
        bob.command("UNSUB *")


def test_pub_reply_goes_to_the_original_publisher(broker):
    with session(broker, "alice") as alice, session(broker, "bob") as bob:
        assert alice.command("SUB MESSAGE /accounts/alice").code == 200
        assert bob.command("SUB MESSAGE /m/reply").code == 200
        asked = smuid_of(alice.publish("/m/reply", "Q1", [("Reply", "YES")]))
        note = bob.message()
        bob.ack()
        cmuid = header(note, "Cmuid")
        reply = bob.publish("/m/reply", "CF0456",
                            [("Smuid", header(note, "Smuid")), ("Cmuid", cmuid)],
                            [("text/plain", b"Thank you")], kind="REPLY")
        assert reply.code == 200 and reply.lines[-1].startswith("CF0456 ")
        answer = alice.message()
        assert answer.topic == "/accounts/alice"
        assert header(answer, "X-Reply-Smuid").endswith(f"/{asked}")
        assert header(answer, "X-Reply-Cmuid") == cmuid
        assert header(answer, "Cmuid").startswith("bob/")
        assert answer.message.sections[0].body == b"Thank you"
        alice.ack()
        bob.command("UNSUB *")
        alice.command("UNSUB *")


def test_receipt_goes_to_the_publishers_account_topic(broker):
    with session(broker, "jtegen") as j, session(broker, "bob") as bob:
        assert j.command("SUB MESSAGE /accounts/jtegen").code == 200
        assert bob.command("SUB MESSAGE /m/receipt").code == 200
        smuid = smuid_of(j.publish("/m/receipt", "R1", [("Receipt", "YES")]))
        bob.message()
        bob.ack()
        receipt = j.message()
        assert receipt.topic == "/accounts/jtegen"
        assert header(receipt, "X-Receipt-Smuid").endswith(f"/{smuid}")
        j.ack()
        bob.command("UNSUB *")
        j.command("UNSUB *")


def test_size_and_count_limits_refuse_with_414_and_store_nothing(broker):
    with session(broker) as pub:
        before = pub.command("COUNT MESSAGE /m/limit").lines[-1]
        too_big = pub.publish("/m/limit", "BIG", sections=[("application/octet-stream",
                                                           b"x" * 1001)])
        assert too_big.code == 414
        assert pub.command("COUNT MESSAGE /m/limit").lines[-1] == before
        assert pub.publish("/m/limit", "FITS", sections=[("text/plain", b"x" * 1000)]).code == 200
        for i in range(2):
            assert pub.publish("/m/count", f"C{i}", [("Timeout", "-1")]).code == 200
        assert pub.publish("/m/count", "C2", [("Timeout", "-1")]).code == 414
        assert pub.command("COUNT MESSAGE /m/count").lines[-1] == "2"


def test_ten_megabyte_multipart_binary_roundtrip(broker):
    rnd = __import__("random").Random(7)
    parts = [("application/octet-stream", rnd.randbytes(6 * 1024 * 1024)),
             ("image/png", b"\r\n.\r\n" + rnd.randbytes(4 * 1024 * 1024 - 5)),
             ("text/plain", b"")]
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /m/big").code == 200
        smuid = smuid_of(pub.publish("/m/big", "BIG1", sections=parts))
        note = bob.message(timeout=60)
        assert [(s.content_type, s.body) for s in note.message.sections] == parts
        bob.ack()
        got = pub.command(f"GET MESSAGE /m/big {smuid}")
        assert [(s.content_type, s.body) for s in got.messages[0].sections] == parts
        bob.command("UNSUB *")


def test_unacked_notification_is_retried_then_dead(broker):
    with session(broker, "alice") as alice, session(broker) as pub:
        assert alice.command("SUB MESSAGE /m/retry").code == 200
        first = smuid_of(pub.publish("/m/retry", "D1"))
        second = smuid_of(pub.publish("/m/retry", "D2"))
        a = alice.message()
        b = alice.message(timeout=10)  # sent again after the 1 s retry timeout
        assert header(a, "Smuid") == header(b, "Smuid") and header(a, "Smuid").endswith(
            f"/{first}")
        c = alice.message(timeout=10)  # max retries (1) spent: dead; the next one comes
        assert header(c, "Smuid").endswith(f"/{second}")
        alice.ack()
        alice.command("UNSUB *")
        # The dead message went to Trash for audit.
        assert str(first) in pub.command("LIST MESSAGE /m/retry/Trash").lines[-1]


def test_queue_mode_gives_each_message_to_one_subscriber(broker):
    with session(broker, "bob") as bob, session(broker, "alice") as alice, \
            session(broker) as pub:
        bob.command("SUB MESSAGE /m/queue")
        alice.command("SUB MESSAGE /m/queue")
        sent = [smuid_of(pub.publish("/m/queue", f"Q{i}")) for i in range(6)]
        got: dict[str, list[int]] = {"bob": [], "alice": []}
        for name, s in (("bob", bob), ("alice", alice)):
            while not s.quiet(1.0):
                note = s.message()
                got[name].append(int(header(note, "Smuid").rsplit("/", 1)[1]))
                s.ack()
        assert sorted(got["bob"] + got["alice"]) == sent
        assert got["bob"] and got["alice"]
        bob.command("UNSUB *")
        alice.command("UNSUB *")


def test_publish_refusals(broker):
    with session(broker, "bob") as bob:
        assert bob.publish("/nowhere", "X").code == 404
        assert bob.publish("/accounts/alice", "X").code == 404  # not visible to bob
    with session(broker) as root:
        assert root.command("CREATE TOPIC /closed").code == 200
    with session(broker, "bob") as bob:
        assert bob.publish("/closed", "X").code == 404
    with RawClient(broker.host, broker.port) as raw:
        raw.login("root", "pw")
        raw.send(b"PUB MESSAGE /m/a BAD\r\nBogus: 1\r\n\r\n.\r\n")
        assert raw.read_reply()[0].startswith(b"400 ")
        raw.send(b"PUB MESSAGE /m/a OK1\r\n\r\n.\r\n")  # no data sections: valid
        assert raw.read_reply()[0] == b"200-OK\r\n"


def test_pipelined_publishes_answer_in_order(broker):
    with session(broker) as pub:
        for i in range(200):
            pub.send_publish("/m/b", f"P{i}")
        pub.sock.sendall(b"NOOP\r\n")
        smuids = []
        for i in range(200):
            reply = pub.reply()
            assert reply.lines[-1].startswith(f"P{i} ")
            smuids.append(smuid_of(reply))
        assert pub.reply().lines == ["OK"]
    assert smuids == sorted(smuids)


def test_listener_log_is_clean(broker):
    assert broker.alive()
    assert "Traceback" not in broker.log(), broker.log()[-3000:]
    assert os.path.exists(broker.log_path)


def test_set_notify_port_sends_notifications_to_the_clients_listener(broker):
    import socket as s

    listener = s.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(scaled(10))
    port = listener.getsockname()[1]
    with session(broker, "bob") as bob, session(broker) as pub:
        assert pub.command("CREATE TOPIC /m/np").code == 200
        assert bob.command("SUB MESSAGE /m/np").code == 200
        assert bob.command(f"SET NOTIFY PORT {port}").lines == ["OK"]
        channel, (peer, _) = listener.accept()  # connected before the reply came
        assert peer == "127.0.0.1"
        channel.settimeout(scaled(10))
        smuid = smuid_of(pub.publish("/m/np", "NP1"))
        data = b""
        while not data.endswith(b"\r\n.\r\n"):
            data += channel.recv(65536)
        assert data.startswith(b"NOTIFY MESSAGE /m/np\r\n")
        assert b"/%d\r\n" % smuid in data
        assert bob.quiet(0.5)  # nothing on the session connection itself
        channel.sendall(b"310 ACK\r\n")
        assert channel.recv(100) == b"310 ACK\r\n"
        # Nothing is listening on the old port any more: 408, and the session stays usable.
        listener.close()
        channel.close()
        dead = s.socket()
        dead.bind(("127.0.0.1", 0))
        free = dead.getsockname()[1]
        dead.close()
        assert bob.command(f"SET NOTIFY PORT {free}").code == 408
        assert bob.command("NOOP").lines == ["OK"]
        # With the listener gone, notifications come back to the session.
        smuid2 = smuid_of(pub.publish("/m/np", "NP2"))
        note = bob.message()
        assert header(note, "Smuid").endswith(f"/{smuid2}")
        bob.ack()
        assert bob.command("SET NOTIFY PORT 0").code == 400
        bob.command("UNSUB *")
