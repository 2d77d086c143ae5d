"""Issue 39 item 2 over real sockets: the delivery window (profile §9.7), on SQLite and
PostgreSQL. ``SET NOTIFY WINDOW n`` lets n NOTIFY MESSAGEs go unacknowledged on the
connection; a bare ``310 ACK`` answers the oldest, ``310 ACK <smuid>`` that one in any order
(409 when the connection holds no such message); what is not ACKed goes to the next session;
in queue mode each message of the window holds its own lock. The mailbox's rules on their
own are in unit/delivery/test_mailbox.py."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_listener
from tests.support.queue_clients import ack_answer, deliveries_of, smuid_in
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

MAX_WINDOW = 8  # this listener's SMQP_MAX_NOTIFY_WINDOW

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for path in ['/w', '/w/a', '/w/b', '/w/c', '/w/d', '/w/e', '/w/retry', '/wq', '/wq/jobs']:
    ts.create_topic(snap, path)
Topic.objects.filter(path='/w/retry').update(retry_timeout=1, max_retries=1)
Topic.objects.filter(path__startswith='/wq').update(delivery_mode='queue', retry_timeout=60,
                                                    max_retries=5)
for path in ['/w', '/wq']:
    topic = Topic.objects.get(path=path)
    for name in ['bob', 'alice']:
        UALEntry.objects.create(topic=topic, principal_kind='account',
                                account=Account.objects.get(username=name), right='subscribe')
from topics import tree
tree.changed()  # the update() calls above send no signals
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"window-{request.param}"),
                        extra_env={"SMQP_MAX_NOTIFY_WINDOW": str(MAX_WINDOW)},
                        setup=SETUP) as b:
        yield b


def session(broker, user: str = "root") -> Session:
    return Session(broker.host, broker.port, user)


def logged_in(broker, user: str) -> tuple[Session, str]:
    """A session of ``user`` and its guid (the login reply's last line)."""
    s = Session(broker.host, broker.port)
    assert s.command(f"LOGIN {user} CLEAR/1.0").code == 200
    reply = s.command(f"PASS {user} pw")
    assert reply.code == 200 and reply.lines[-1].startswith("Guid: "), reply
    return s, reply.lines[-1].removeprefix("Guid: ")


def received(s: Session, n: int) -> list[int]:
    """The smuids of the next ``n`` NOTIFY MESSAGEs, none ACKed."""
    return [smuid_in(s.message()) for _ in range(n)]


def test_window_n_sends_n_before_any_ack_and_a_bare_ack_answers_the_oldest(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /w/a").code == 200
        assert bob.command("SET NOTIFY WINDOW 3").lines == ["OK"]
        sent = [smuid_of(pub.publish("/w/a", f"A{i}")) for i in range(5)]
        assert received(bob, 3) == sent[:3]
        assert bob.quiet(1.0)  # the window is full: the fourth waits for an ACK
        assert ack_answer(bob) == 310  # the oldest: sent[0]
        assert received(bob, 1) == [sent[3]]
        assert bob.quiet(0.5)
        assert ack_answer(bob, sent[0]) == 409  # answered already: not held here
        assert ack_answer(bob, sent[1]) == 310  # still held: the bare ACK took sent[0]
        assert received(bob, 1) == [sent[4]]
        for smuid in (sent[2], sent[3], sent[4]):
            assert ack_answer(bob) == 310  # oldest first...
            assert ack_answer(bob, smuid) == 409  # ...so this one is answered
        assert ack_answer(bob) == 400  # nothing waits for an ACK
        assert bob.command("UNSUB *").code == 200


def test_a_larger_window_lets_waiting_messages_go_at_once(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /w/b").code == 200
        sent = [smuid_of(pub.publish("/w/b", f"B{i}")) for i in range(3)]
        assert received(bob, 1) == sent[:1]
        assert bob.quiet(1.0)  # window 1 (the default): the draft's behaviour
        assert bob.command("SET NOTIFY WINDOW 3").code == 200
        assert received(bob, 2) == sent[1:]  # no ACK needed for these
        for _ in sent:
            assert ack_answer(bob) == 310
        assert bob.command("UNSUB *").code == 200


def test_acks_by_smuid_in_any_order_and_409_for_what_is_not_held(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /w/c").code == 200
        assert bob.command("SET NOTIFY WINDOW 4").code == 200
        sent = [smuid_of(pub.publish("/w/c", f"C{i}")) for i in range(4)]
        assert received(bob, 4) == sent
        assert ack_answer(bob, sent[2]) == 310
        assert ack_answer(bob, sent[0]) == 310
        assert ack_answer(bob, sent[2]) == 409  # ACKed already
        assert ack_answer(bob, sent[-1] + 1000) == 409  # never sent here
        assert ack_answer(bob) == 310  # the oldest left: sent[1]
        assert ack_answer(bob, sent[1]) == 409
        assert ack_answer(bob, sent[3]) == 310
        assert ack_answer(bob) == 400
        assert bob.quiet(1.0)  # nothing goes again: every one was ACKed once
    with session(broker, "bob") as bob:
        assert bob.quiet(1.5)  # nor at the next login
        assert bob.command("UNSUB *").code == 200


def test_the_unacked_ones_go_to_the_next_session_after_a_disconnect(broker):
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /w/d").code == 200
        assert bob.command("SET NOTIFY WINDOW 4").code == 200
        sent = [smuid_of(pub.publish("/w/d", f"D{i}")) for i in range(5)]
        assert received(bob, 4) == sent[:4]
        assert ack_answer(bob, sent[1]) == 310
        assert received(bob, 1) == [sent[4]]
        # Gone without QUIT, sent[0], sent[2], sent[3] and sent[4] not ACKed.
    with session(broker, "bob") as bob:  # window 1 again: a new session
        got = []
        for _ in range(4):
            got += received(bob, 1)
            assert ack_answer(bob) == 310
        assert got == [sent[0], sent[2], sent[3], sent[4]]
        assert bob.quiet(1.0)
        assert bob.command("UNSUB *").code == 200


def test_each_message_of_the_window_keeps_its_own_retries(broker):
    """/w/retry: retry timeout 1 s, max retries 1. The second is ACKed; the first, never
    ACKed, goes again once at its own deadline and is then dead (Trash)."""
    with session(broker, "alice") as alice, session(broker) as pub:
        assert alice.command("SUB MESSAGE /w/retry").code == 200
        assert alice.command("SET NOTIFY WINDOW 2").code == 200
        first = smuid_of(pub.publish("/w/retry", "R1"))
        second = smuid_of(pub.publish("/w/retry", "R2"))
        assert received(alice, 2) == [first, second]
        assert ack_answer(alice, second) == 310
        assert smuid_in(alice.message(timeout=10)) == first  # its retry
        assert alice.quiet(3.0)  # its retries spent: dead, not sent again
        assert ack_answer(alice) == 400  # nothing in flight any more
        assert alice.command("UNSUB *").code == 200
        assert pub.command("LIST MESSAGE /w/retry/Trash").lines[-1] == str(first)


def test_queue_mode_two_sessions_of_one_account_share_the_backlog_once(broker):
    """Each message of a window goes under a lock of its own, held by the session that got
    it; the account's two sessions share the messages, none goes to both."""
    s1, guid1 = logged_in(broker, "bob")
    s2, guid2 = logged_in(broker, "bob")
    with s1, s2, session(broker) as pub:
        assert s1.command("SUB MESSAGE /wq/jobs").code == 200
        for s in (s1, s2):
            assert s.command("SET NOTIFY WINDOW 3").code == 200
        sent = [smuid_of(pub.publish("/wq/jobs", f"J{i}")) for i in range(10)]
        first = {guid1: received(s1, 3), guid2: received(s2, 3)}
        assert s1.quiet(1.0) and s2.quiet(0.2)  # both windows full
        assert not set(first[guid1]) & set(first[guid2])
        for guid, smuids in first.items():
            for smuid in smuids:
                [(account, state, holder, attempts)] = deliveries_of(broker.env, smuid)
                assert (account, state, holder, attempts) == ("bob", "notified", guid, 1)
        # The holders answer out of order (s1) and oldest first (s2) until all are done.
        got = {guid1: list(first[guid1]), guid2: list(first[guid2])}
        assert ack_answer(s1, first[guid1][2]) == 310
        assert ack_answer(s1, first[guid2][0]) == 409  # s2's lock, not s1's
        assert ack_answer(s1, first[guid1][0]) == 310
        assert ack_answer(s1, first[guid1][1]) == 310
        for _ in range(3):
            assert ack_answer(s2) == 310
        while len(got[guid1]) + len(got[guid2]) < len(sent):
            for s, guid in ((s1, guid1), (s2, guid2)):
                if not s.quiet(0.3):
                    got[guid] += received(s, 1)
                    assert ack_answer(s, got[guid][-1]) == 310
        everything = got[guid1] + got[guid2]
        assert sorted(everything) == sent  # each once
        assert s1.quiet(1.0) and s2.quiet(0.2)
        for smuid in sent:
            assert [row[:2] for row in deliveries_of(broker.env, smuid)] == [("bob", "acked")]
        assert s1.command("UNSUB *").code == 200


def test_the_window_is_1_to_max_window_as_the_login_reply_says(broker):
    with Session(broker.host, broker.port) as anonymous:
        assert anonymous.command("SET NOTIFY WINDOW 2").code == 401
    with Session(broker.host, broker.port) as bob, session(broker) as pub:
        assert bob.command("LOGIN bob CLEAR/1.0").code == 200
        login = bob.command("PASS bob pw").lines
        # Beside the other limits (profile §9.7), before the Guid.
        assert login[-3:-1] == ["Max-Subscriptions: 1000", f"Max-Window: {MAX_WINDOW}"]
        assert bob.command("SUB MESSAGE /w/e").code == 200
        assert bob.command("SET NOTIFY WINDOW 2").code == 200
        too_large = bob.command(f"SET NOTIFY WINDOW {MAX_WINDOW + 1}")
        assert (too_large.code, too_large.lines) == (
            400, [f"Bad request (window must be 1 to {MAX_WINDOW})"])
        assert bob.command("SET NOTIFY WINDOW 0").lines == ["Bad request (invalid window)"]
        assert bob.command("SET NOTIFY WINDOW x").code == 400
        sent = [smuid_of(pub.publish("/w/e", f"E{i}")) for i in range(3)]
        assert received(bob, 2) == sent[:2]  # still 2: the refusals changed nothing
        assert bob.quiet(1.0)
        assert bob.command(f"SET NOTIFY WINDOW {MAX_WINDOW}").code == 200
        assert received(bob, 1) == sent[2:]
        for _ in sent:
            assert ack_answer(bob) == 310
        assert bob.command("UNSUB *").code == 200


def test_a_set_notify_port_connection_takes_acks_by_smuid(broker):
    """With SET NOTIFY PORT the window's NOTIFYs and their ACKs travel on the client's own
    listener connection; ``310 ACK <smuid>`` is read there too."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(scaled(10))
    with listener, session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /w/e").code == 200
        assert bob.command("SET NOTIFY WINDOW 2").code == 200
        assert bob.command(f"SET NOTIFY PORT {listener.getsockname()[1]}").code == 200
        channel, _ = listener.accept()
        with channel:
            channel.settimeout(scaled(10))
            sent = [smuid_of(pub.publish("/w/e", f"P{i}")) for i in range(2)]
            data = b""
            while data.count(b"\r\n.\r\n") < 2:
                data += channel.recv(65536)
            for smuid in sent:
                assert b"/%d\r\n" % smuid in data
            channel.sendall(f"310 ACK {sent[1]}\r\n".encode())
            assert channel.recv(100) == b"310 ACK\r\n"
            channel.sendall(f"310 ACK {sent[1]}\r\n".encode())
            assert channel.recv(100).startswith(b"409 ")
            channel.sendall(b"310 ACK x\r\n")
            assert channel.recv(100) == b"400 Bad request (invalid smuid)\r\n"
            channel.sendall(b"310 ACK\r\n")  # the oldest: sent[0]
            assert channel.recv(100) == b"310 ACK\r\n"
        assert bob.command("UNSUB *").code == 200


def test_listener_log_is_clean(broker):
    assert broker.alive()
    assert "Traceback" not in broker.log(), broker.log()[-3000:]
