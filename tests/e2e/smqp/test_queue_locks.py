"""Issue 22 item 2 over real sockets: queue mode with locks (profile §9.6), on SQLite and
PostgreSQL. A message sent to a session is locked to it; only that session's 310 ACK before
the deadline consumes it; the lock ends at the deadline or with the session, and the message
goes to the next subscriber; attempts are counted, and the message is dead (Trash) once they
are spent. No Celery here: the listener ends the locks of its own sessions."""

from __future__ import annotations

import time

import pytest

from tests.conftest import fresh_listener
from tests.support.queue_clients import ack_answer, deliveries_of, first_notified, smuid_in
from tests.support.smqp_session import Session, smuid_of
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
for path in ['/ql', '/ql/expire', '/ql/leave', '/ql/dead']:
    ts.create_topic(snap, path)
Topic.objects.filter(path__startswith='/ql/').update(delivery_mode='queue', max_retries=5)
Topic.objects.filter(path='/ql/expire').update(retry_timeout=2)
Topic.objects.filter(path='/ql/leave').update(retry_timeout=60)
Topic.objects.filter(path='/ql/dead').update(retry_timeout=1, max_retries=1)
ql = Topic.objects.get(path='/ql')
for name in ['bob', 'alice']:
    a = Account.objects.get(username=name)
    UALEntry.objects.create(topic=ql, principal_kind='account', account=a, right='subscribe')
from topics import tree
tree.changed()  # the update() calls above send no signals
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    """The listener, started on a copy of a database the setup was made in: its caches
    hold the setup from the start."""
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"locks-{request.param}"),
                        setup=SETUP) as b:
        yield b


def session(broker, user: str = "root") -> Session:
    return Session(broker.host, broker.port, user)


def test_an_ack_after_the_deadline_is_409_and_the_other_account_gets_the_message_once(broker):
    with session(broker, "bob") as bob, session(broker, "alice") as alice, \
            session(broker) as pub:
        subscribers = {"bob": bob, "alice": alice}
        for s in subscribers.values():
            assert s.command("SUB MESSAGE /ql/expire").code == 200
        smuid = smuid_of(pub.publish("/ql/expire", "E1"))
        late, got = first_notified(subscribers)
        assert got == smuid
        [other] = [name for name in subscribers if name != late]
        # No 310 ACK within the 2 s retry timeout: the lock ends, the other account gets it.
        assert smuid_in(subscribers[other].message(timeout=10)) == smuid
        assert ack_answer(subscribers[late]) == 409
        # The refused ACK changed nothing: the other account's session holds the lock.
        [(account, state, holder, attempts)] = deliveries_of(broker.env, smuid)
        assert (account, state, attempts) == (other, "notified", 2)
        assert holder.startswith(other)
        assert ack_answer(subscribers[other]) == 310
        assert bob.quiet(1.5) and alice.quiet(0.5)  # and neither gets it again
        assert [row[:2] for row in deliveries_of(broker.env, smuid)] == [(other, "acked")]
        for s in subscribers.values():
            s.command("UNSUB *")


def test_a_session_that_ends_releases_its_lock_at_once(broker):
    with session(broker, "bob") as bob, session(broker, "alice") as alice, \
            session(broker) as pub:
        subscribers = {"bob": bob, "alice": alice}
        for s in subscribers.values():
            assert s.command("SUB MESSAGE /ql/leave").code == 200
        smuid = smuid_of(pub.publish("/ql/leave", "L1"))
        holder, _ = first_notified(subscribers)
        [other] = [name for name in subscribers if name != holder]
        subscribers[holder].close()  # gone without QUIT, the message not ACKed
        # The lock's deadline is a minute away: the message comes at once all the same.
        started = time.monotonic()
        assert smuid_in(subscribers[other].message(timeout=10)) == smuid
        assert time.monotonic() - started < 10
        assert ack_answer(subscribers[other]) == 310
        [(account, state, _, attempts)] = deliveries_of(broker.env, smuid)
        assert (account, state, attempts) == (other, "acked", 2)
        subscribers[other].command("UNSUB *")
    with session(broker, holder) as again:
        assert again.command("UNSUB *").code == 200


def test_attempts_are_counted_and_the_message_is_dead_once_they_are_spent(broker):
    """One subscriber: an ended lock gives the message back to the same account. Max retries
    1: two attempts, then dead, and in Trash for audit."""
    with session(broker, "bob") as bob, session(broker) as pub:
        assert bob.command("SUB MESSAGE /ql/dead").code == 200
        smuid = smuid_of(pub.publish("/ql/dead", "D1"))
        assert smuid_in(bob.message()) == smuid
        time.sleep(scaled(1.5))  # past the deadline
        assert ack_answer(bob) == 409
        assert smuid_in(bob.message(timeout=10)) == smuid  # the second attempt
        time.sleep(scaled(1.5))
        assert ack_answer(bob) == 409
        assert bob.quiet(2.0)  # no third attempt
        [(account, state, holder, attempts)] = deliveries_of(broker.env, smuid)
        assert (account, state, holder, attempts) == ("bob", "dead", "", 2)
        assert pub.command("LIST MESSAGE /ql/dead/Trash").lines[-1] == str(smuid)
        bob.command("UNSUB *")
