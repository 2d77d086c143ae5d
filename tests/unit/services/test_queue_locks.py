"""Queue-mode locks (profile §9.6) in the store, through the service verbs that every door
calls (:mod:`broker.services.locks`): who may lock, whose ACK consumes, where an ended lock
sends the message, and what the sweeps may touch. The same rules over real sockets and
across listener processes are in e2e/smqp/test_queue_locks and e2e/smqp/test_queue_exactly_once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.models import Delivery, Message, Subscription, UsageEvent
from broker.services import ServiceError, locks, sweeps
from broker.services import read as read_service
from tests.support.factories import make_account
from topics.models import Topic
from ual.models import UALEntry

pytestmark = pytest.mark.django_db

RETRY = 10


@pytest.fixture
def queue():
    """A queue topic ``/q`` (retry timeout 10 s, max retries 2), its subscribers bob,
    alice and carol, and one message waiting for bob: (topic, accounts, smuid)."""
    topic = Topic.objects.create(path="/q", delivery_mode="queue", retry_timeout=RETRY,
                                 max_retries=2, expiry_timeout=60)
    accounts = sorted([make_account(n) for n in ("bob", "alice", "carol")], key=lambda a: a.pk)
    for who in accounts:
        UALEntry.objects.create(topic=topic, principal_kind="account", account=who,
                                right="subscribe")
        Subscription.objects.create(account=who, resource="MESSAGE", pattern="/q")
    message = Message.objects.create(topic=topic, cmuid="c1", created=timezone.now(),
                                     timeout=60)
    Delivery.objects.create(account=accounts[0], message=message)
    return topic, accounts, message.pk


def delivery(smuid: int) -> Delivery:
    return Delivery.objects.get(message_id=smuid)


def test_only_one_session_wins_the_lock_and_each_lock_counts_an_attempt(queue):
    _, (first, second, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    assert not locks.lock(first.pk, "first02", smuid, RETRY, 2)  # held by another session
    assert not locks.lock(second.pk, "second01", smuid, RETRY, 2)  # not that account's turn
    row = delivery(smuid)
    assert (row.state, row.holder, row.attempts) == ("notified", "first01", 1)
    assert row.last_attempt is not None and row.next_attempt > row.last_attempt
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)  # the holder sends it again
    assert delivery(smuid).attempts == 2


def test_an_expired_lock_may_be_taken_by_another_session_of_the_account(queue):
    _, (first, _, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    Delivery.objects.filter(message_id=smuid).update(
        next_attempt=timezone.now() - timedelta(seconds=1))
    assert locks.lock(first.pk, "first02", smuid, RETRY, 2)
    assert delivery(smuid).holder == "first02"


def test_no_lock_once_the_attempts_are_spent(queue):
    _, (first, _, _), smuid = queue
    Delivery.objects.filter(message_id=smuid).update(attempts=3)
    assert not locks.lock(first.pk, "first01", smuid, RETRY, 2)


def test_the_holders_ack_consumes_the_message_and_starts_its_timeout(queue):
    _, (first, _, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    assert locks.ack_locked(first.pk, "first01", smuid) == []
    row = delivery(smuid)
    assert (row.state, row.holder) == ("acked", "") and row.acked is not None
    assert Message.objects.get(pk=smuid).expires is not None
    assert UsageEvent.objects.filter(kind="ack", smuid=smuid, account=first.username).exists()
    with pytest.raises(ServiceError) as refused:  # consumed once, never twice
        locks.ack_locked(first.pk, "first01", smuid)
    assert refused.value.code == 409


def test_an_ack_by_a_session_not_holding_the_lock_is_409_and_changes_nothing(queue):
    _, (first, second, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    before = list(Delivery.objects.values_list())
    for account_id, guid in ((first.pk, "first02"), (second.pk, "second01"),
                             (second.pk, "first01")):
        with pytest.raises(ServiceError) as refused:
            locks.ack_locked(account_id, guid, smuid)
        assert (refused.value.code, refused.value.text) == (409, "Conflict (lock not held)")
    assert list(Delivery.objects.values_list()) == before
    assert Message.objects.get(pk=smuid).expires is None


def test_an_ack_after_the_deadline_is_409(queue):
    _, (first, _, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    Delivery.objects.filter(message_id=smuid).update(
        next_attempt=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ServiceError) as refused:
        locks.ack_locked(first.pk, "first01", smuid)
    assert refused.value.code == 409
    assert delivery(smuid).state == "notified"


def test_a_released_lock_offers_the_message_to_the_next_account_in_turn(queue):
    topic, (first, second, third), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    [moved] = locks.release(first.pk, "first01")
    assert (moved.smuid, moved.topic_id, moved.accounts) == (smuid, topic.pk, [second.pk])
    row = delivery(smuid)
    assert (row.account_id, row.state, row.holder, row.attempts) == (second.pk, "pending", "", 1)
    assert locks.release(first.pk, "first01") == []  # nothing held any more
    Delivery.objects.filter(message_id=smuid).update(account_id=third.pk)
    assert locks.lock(third.pk, "third01", smuid, RETRY, 2)
    [moved] = locks.release(third.pk, "third01", [smuid])
    assert moved.accounts == [first.pk]  # round robin: after the last, the first


def test_a_lock_that_ends_with_its_attempts_spent_is_dead_and_the_message_in_trash(queue):
    _, (first, _, _), smuid = queue
    Delivery.objects.filter(message_id=smuid).update(attempts=2)
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    assert locks.release(first.pk, "first01") == []
    assert delivery(smuid).state == "dead"
    assert Message.objects.get(pk=smuid).state == "trash"
    assert UsageEvent.objects.filter(kind="dead", smuid=smuid).exists()


def test_a_lock_released_unsent_gives_its_attempt_back_and_is_not_dead(queue):
    """A session whose transport ended before it wrote the locked message (issue 34 item 1:
    streams dropped while taking items) does not spend the message's retries."""
    _, (first, second, _), smuid = queue
    Delivery.objects.filter(message_id=smuid).update(attempts=2)
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    [moved] = locks.release(first.pk, "first01", unsent=[smuid])
    assert moved.accounts == [second.pk]
    row = delivery(smuid)
    assert (row.account_id, row.state, row.holder, row.attempts) == (second.pk, "pending", "", 2)
    assert Message.objects.get(pk=smuid).state != "trash"
    # Only the session's own locks of those messages: another's unsent list changes nothing.
    assert locks.lock(second.pk, "second01", smuid, RETRY, 2)
    assert locks.release(second.pk, "other01", unsent=[smuid]) == []
    assert delivery(smuid).attempts == 3


def test_with_nobody_subscribed_an_ended_lock_leaves_the_message_waiting(queue):
    _, (first, _, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    Subscription.objects.all().delete()
    assert locks.release(first.pk, "first01") == []
    assert not Delivery.objects.filter(message_id=smuid).exists()
    message = Message.objects.get(pk=smuid)
    assert message.state == "pending" and message.expires is not None  # its timeout runs


def test_the_deadline_sweep_ends_only_expired_locks(queue):
    _, (first, second, _), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    assert locks.expire_locks() == 0
    assert locks.expire_locks(timezone.now() + timedelta(seconds=RETRY + 1)) == 1
    row = delivery(smuid)
    assert (row.account_id, row.state, row.attempts) == (second.pk, "pending", 1)


def test_the_waiting_sweep_never_touches_a_locked_delivery(queue):
    _, (first, _, third), smuid = queue
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    later = timezone.now() + timedelta(seconds=RETRY + 1)
    assert sweeps.requeue_stale_queue_deliveries(later) == 0
    assert delivery(smuid).holder == "first01"
    locks.release(first.pk, "first01")
    # Moved: its turn with the next account starts now, and ends a retry timeout later.
    assert sweeps.requeue_stale_queue_deliveries() == 0
    later = timezone.now() + timedelta(seconds=RETRY + 1)
    assert sweeps.requeue_stale_queue_deliveries(later) == 1
    row = delivery(smuid)
    assert (row.account_id, row.state, row.attempts) == (third.pk, "pending", 1)  # no attempt


def test_a_waiting_delivery_moves_on_after_the_retry_timeout_since_it_was_assigned(queue):
    _, (_, second, _), smuid = queue
    assert sweeps.requeue_stale_queue_deliveries() == 0
    assert sweeps.requeue_stale_queue_deliveries(
        timezone.now() + timedelta(seconds=RETRY + 1)) == 1
    row = delivery(smuid)
    assert (row.account_id, row.state, row.attempts) == (second.pk, "pending", 0)


def test_a_locked_delivery_is_not_in_the_accounts_backlog(queue):
    _, (first, _, _), smuid = queue
    assert [m for _, _, m in read_service.backlog_for([first.pk])] == [smuid]
    assert locks.lock(first.pk, "first01", smuid, RETRY, 2)
    assert read_service.backlog_for([first.pk]) == []


def test_a_waiting_delivery_stays_while_its_account_is_consuming_the_topic(queue):
    topic, (first, second, _), smuid = queue
    busy = Message.objects.create(topic=topic, cmuid="c2", created=timezone.now())
    Delivery.objects.create(account=first, message=busy)
    assert locks.lock(first.pk, "first01", busy.pk, RETRY, 2)  # a session of it at work
    later = timezone.now() + timedelta(seconds=RETRY - 1)
    Delivery.objects.filter(message_id=smuid).update(next_attempt=later - timedelta(seconds=5))
    assert sweeps.requeue_stale_queue_deliveries(later) == 0
    assert delivery(smuid).account_id == first.pk
    # Its lock past the deadline (its holder gone, say): no longer consuming.
    assert sweeps.requeue_stale_queue_deliveries(later + timedelta(seconds=2)) == 1
    assert delivery(smuid).account_id == second.pk
