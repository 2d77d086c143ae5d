"""The backlog queries and the sweeps of the message service (no socket needed for these
rules)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from broker.models import Delivery, Message
from broker.services import ack as ack_service
from broker.services import read as read_service
from broker.services import subscriptions as subscription_service
from tests.support.factories import make_account
from topics.models import Topic

pytestmark = pytest.mark.django_db


def held(topic: Topic, count: int, priorities: dict[int, int] | None = None) -> list[int]:
    now = timezone.now()
    priorities = priorities or {}
    Message.objects.bulk_create([
        Message(topic=topic, cmuid=f"c{i}", created=now, priority=priorities.get(i))
        for i in range(count)])
    return list(Message.objects.filter(topic=topic).order_by("pk").values_list("pk", flat=True))


def test_a_new_subscription_gets_every_held_message_however_many():
    bob = make_account("bob")
    topic = Topic.objects.create(path="/many")
    ids = held(topic, 10_050)  # more than one page of the session's backlog
    assert subscription_service.subscribe_backlog(bob.pk, [topic], None) == 10_050
    assert sorted(Delivery.objects.filter(account=bob).values_list("message_id", flat=True)) == ids
    # Subscribing again adds nothing: every held message is already the account's.
    assert subscription_service.subscribe_backlog(bob.pk, [topic], None) == 0


def test_a_backlog_page_is_the_first_messages_in_delivery_order():
    bob = make_account("bob")
    topic = Topic.objects.create(path="/order")
    ids = held(topic, 6, priorities={4: 1, 2: 3})
    subscription_service.subscribe_backlog(bob.pk, [topic], None)
    page = read_service.backlog_for([bob.pk], limit=3)
    assert [smuid for _, _, smuid in page] == [ids[4], ids[2], ids[0]]
    everything = read_service.backlog_for([bob.pk], limit=100)
    assert [smuid for _, _, smuid in everything] == [ids[4], ids[2], ids[0], ids[1], ids[3],
                                                     ids[5]]


def test_several_accounts_backlogs_each_get_their_own_page():
    bob, alice = make_account("bob"), make_account("alice")
    topic = Topic.objects.create(path="/both")
    ids = held(topic, 5, priorities={3: 1})
    subscription_service.subscribe_backlog(bob.pk, [topic], None)
    Delivery.objects.create(account=alice, message_id=ids[4])
    rows = read_service.backlog_for([bob.pk, alice.pk], limit=2)
    # bob's first two in delivery order (Priority 1 first), and alice's one.
    assert [(a, m) for a, _, m in rows] == [(bob.pk, ids[3]), (bob.pk, ids[0]),
                                            (alice.pk, ids[4])]


def test_a_queue_topic_backlog_skips_messages_another_subscriber_holds():
    bob, alice = make_account("bob"), make_account("alice")
    topic = Topic.objects.create(path="/q", delivery_mode=Topic.DeliveryMode.QUEUE)
    ids = held(topic, 3)
    Delivery.objects.create(account=bob, message_id=ids[0])
    assert subscription_service.subscribe_backlog(alice.pk, [topic], None) == 2
    assert sorted(Delivery.objects.filter(account=alice).values_list("message_id", flat=True)) \
        == ids[1:]


def test_the_expiry_and_purge_sweeps_clear_more_than_one_batch_per_run(settings):
    from datetime import timedelta

    from broker.tasks import expire_messages, purge_trash

    settings.SMQP_SWEEP_BATCH = 3
    topic = Topic.objects.create(path="/sweep")
    ids = held(topic, 8)
    Message.objects.filter(pk__in=ids[:7]).update(
        expires=timezone.now() - timedelta(seconds=1))
    assert expire_messages() == 7  # three batches: 3 + 3 + 1
    assert Message.objects.filter(state=Message.State.TRASH).count() == 7
    settings.SMQP_TRASH_RETENTION = 0
    assert purge_trash() == 7
    assert list(Message.objects.values_list("pk", flat=True)) == ids[7:]


def test_only_an_accounts_first_ack_counts_and_the_first_ack_sends_the_receipt():
    pub, bob, alice = make_account("pub"), make_account("bob"), make_account("alice")
    topic = Topic.objects.create(path="/receipts")
    now = timezone.now()
    held_one = Message.objects.create(topic=topic, publisher=pub, cmuid="r1", created=now,
                                      receipt=True)
    from_backlog = Message.objects.create(topic=topic, publisher=pub, cmuid="r2", created=now,
                                          receipt=True)
    Delivery.objects.create(account=bob, message=held_one)
    receipts_topic = Topic.objects.get(account=pub)

    def ack(account, message):
        return ack_service.ack_batch([ack_service.AckRequest(account.pk, message.pk)])

    [receipt] = ack(bob, held_one)
    assert receipt.topic_id == receipts_topic.pk
    assert Message.objects.get(pk=receipt.smuid).in_reply_to_id == held_one.pk
    assert Delivery.objects.get(account=bob, message=held_one).state == Delivery.State.ACKED
    assert ack(bob, held_one) == []  # again: nothing changes, no second receipt
    assert ack(alice, held_one) == []  # a second account's ACK: recorded, no receipt
    assert Delivery.objects.get(account=alice, message=held_one).state == Delivery.State.ACKED
    # An ACK with no delivery row yet (the message came from a backlog) is a first ACK too.
    [receipt] = ack(alice, from_backlog)
    assert Message.objects.get(pk=receipt.smuid).in_reply_to_id == from_backlog.pk
    assert Delivery.objects.get(account=alice, message=from_backlog).state == "acked"
    assert Message.objects.filter(topic=receipts_topic).count() == 2


def test_an_ack_of_a_deleted_account_is_moot_and_fails_nothing(monkeypatch):
    """A journaled ACK reaches the database later, and its batch is applied until it
    commits: an ACK whose account was deleted meanwhile is left out, and the others of its
    batch are recorded. Both ways: the account's lookup fails, or (a snapshot still cached
    in a process that has not heard of the deletion) the upsert finds no account."""
    from ual import resolution

    bob, gone = make_account("bob"), make_account("gone")
    topic = Topic.objects.create(path="/moot")
    first, second = (Message.objects.create(topic=topic, cmuid=f"m{i}", created=timezone.now())
                     for i in range(2))
    for message in (first, second):
        Delivery.objects.create(account=bob, message=message)
        Delivery.objects.create(account=gone, message=message)
    stale = resolution.snapshot_for_id(gone.pk)
    gone_id = gone.pk
    gone.delete()
    resolution.invalidate_local()

    def acks(message):
        return [ack_service.AckRequest(gone_id, message.pk, 1, False),
                ack_service.AckRequest(bob.pk, message.pk, 1, False)]

    assert ack_service.ack_batch(acks(first)) == []
    real = ack_service.snapshot_for_id
    monkeypatch.setattr(ack_service, "snapshot_for_id",
                        lambda account_id: stale if account_id == gone_id else real(account_id))
    assert ack_service.ack_batch(acks(second)) == []
    assert sorted(Delivery.objects.values_list("message_id", "account_id", "state")) == [
        (first.pk, bob.pk, "acked"), (second.pk, bob.pk, "acked")]


def test_an_ack_that_owes_no_receipt_looks_for_none():
    """The session says when a message cannot want a receipt (its stored header); the ACK
    then reads no first-ACK rows back and runs no receipt query (one used to run for every
    first ACK, an ORM query each, a third of SQLite's end-to-end throughput). Asked with
    ``receipt=True``, the same ACK does look (the control)."""
    from django.db import connection

    bob = make_account("bob")
    topic = Topic.objects.create(path="/quiet")
    now = timezone.now()
    first, second = (Message.objects.create(topic=topic, cmuid=f"q{i}", created=now)
                     for i in range(2))
    Delivery.objects.create(account=bob, message=first)
    Delivery.objects.create(account=bob, message=second)
    connection.ensure_connection()

    def statements_of(smuid: int, receipt: bool) -> list[str]:
        seen: list[str] = []
        connection.connection.set_trace_callback(seen.append)
        try:
            assert ack_service.ack_batch(
                [ack_service.AckRequest(bob.pk, smuid, 1, receipt)]) == []
        finally:
            connection.connection.set_trace_callback(None)
        return [s.lower() for s in seen]

    quiet = statements_of(first.pk, receipt=False)
    assert Delivery.objects.get(account=bob, message=first).state == Delivery.State.ACKED
    assert not any("returning" in s or "receipt" in s for s in quiet), quiet
    looked = statements_of(second.pk, receipt=True)
    assert Delivery.objects.get(account=bob, message=second).state == Delivery.State.ACKED
    assert any("returning" in s for s in looked) and any("receipt" in s for s in looked)


def test_load_ahead_brings_the_pending_messages_after_one_within_its_bounds():
    topic = Topic.objects.create(path="/ahead")
    ids = held(topic, 6)
    Message.objects.filter(pk=ids[2]).update(state=Message.State.TRASH)  # no longer waits
    Message.objects.filter(pk=ids[4]).update(size=5_000)
    loaded = read_service.load_ahead(ids[0], 10, max_bytes=4_000)
    # ids[2] is not pending; ids[4] would pass the byte bound: the read-ahead stops there.
    assert sorted(loaded) == [ids[0], ids[1], ids[3]]
    assert loaded[ids[1]][0] == "/ahead"
    assert sorted(read_service.load_ahead(ids[0], 2, max_bytes=10**9)) == [ids[0], ids[1]]
