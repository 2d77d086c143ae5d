"""The pull service (:mod:`broker.services.pull`) and the REST door's parsers, in process:
receipts on fan-out topics end as fan-out deliveries must (back to the same account, never
moved to another: each account has its own copy), also when the Celery lock sweep ends
them; and every parser of outside input refuses bad input with its own error, never with
another exception (Hypothesis). The same over real HTTP: e2e/rest/test_api, e2e/rest/test_fuzz."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError

from api import pagination
from api import serializers as s
from api.views import topic_path
from broker.models import Delivery, Message, Subscription
from broker.services import ServiceError, locks, pull
from tests.support.examples import examples
from tests.support.factories import make_account
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import snapshot_for


@pytest.fixture
def fanout(db):
    """A fan-out topic ``/f`` (retry timeout 10 s, max retries 1) that bob and alice
    subscribe to, and one message waiting for each of them."""
    topic = Topic.objects.create(path="/f", retry_timeout=10, max_retries=1, expiry_timeout=60)
    accounts = [make_account(n) for n in ("bob", "alice")]
    subs = {}
    for who in accounts:
        UALEntry.objects.create(topic=topic, principal_kind="account", account=who,
                                right="subscribe")
        subs[who.username] = Subscription.objects.create(account=who, resource="MESSAGE",
                                                         pattern="/f")
    message = Message.objects.create(topic=topic, cmuid="c1", created=timezone.now(),
                                     timeout=60)
    for who in accounts:
        Delivery.objects.create(account=who, message=message)
    return accounts, subs, message.pk


def test_a_swept_fanout_lock_returns_the_copy_to_its_own_account(fanout):
    (bob, alice), subs, smuid = fanout
    [got] = pull.pull(snapshot_for(bob), subs["bob"].pk, 5)
    assert got.smuid == smuid and got.attempts == 1
    # The deadline passes and the Celery sweep ends the lock (no door did).
    ended = locks.expire_locks(timezone.now() + timedelta(seconds=11))
    assert ended == 1
    mine = Delivery.objects.get(account=bob, message_id=smuid)
    assert (mine.state, mine.holder) == ("pending", "")
    assert Delivery.objects.get(account=alice, message_id=smuid).state == "pending"
    with pytest.raises(ServiceError) as refused:
        pull.ack(snapshot_for(bob), got.receipt)
    assert refused.value.code == 409
    [again] = pull.pull(snapshot_for(bob), subs["bob"].pk, 5)
    assert again.attempts == 2
    pull.nack(snapshot_for(bob), again.receipt)  # retries spent (max 1): dead for bob only
    assert Delivery.objects.get(account=bob, message_id=smuid).state == "dead"
    assert pull.pull(snapshot_for(bob), subs["bob"].pk, 5) == []
    [hers] = pull.pull(snapshot_for(alice), subs["alice"].pk, 5)
    pull.ack(snapshot_for(alice), hers.receipt)
    assert Delivery.objects.get(account=alice, message_id=smuid).state == "acked"


def test_a_pull_of_another_accounts_subscription_is_404(fanout):
    (bob, _), subs, _ = fanout
    with pytest.raises(ServiceError) as refused:
        pull.pull(snapshot_for(bob), subs["alice"].pk, 5)
    assert refused.value.code == 404


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=120))
def test_a_receipt_that_does_not_parse_is_409(text):
    try:
        smuid, holder = pull.parse_receipt(text)
    except ServiceError as exc:
        assert exc.code == 409
    else:
        number, _, token = text.partition(".")
        assert int(number) == smuid and holder == pull.HOLDER_PREFIX + token


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_a_cursor_decodes_or_is_a_validation_error(text):
    try:
        value = pagination.decode(text)
    except ValidationError as exc:
        assert "cursor" in exc.detail
    else:
        again = pagination.encode(value)  # (NaN is not equal to itself: compared as text)
        assert pagination.encode(pagination.decode(again)) == again


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_a_url_topic_is_a_topic_path_or_404(text):
    try:
        path = topic_path(text)
    except ServiceError as exc:
        assert exc.code == 404
    else:
        assert path.startswith("/")


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(JSONISH, st.fixed_dictionaries({}, optional={
    "headers": st.dictionaries(st.text(max_size=20), st.text(max_size=40) | JSONISH,
                               max_size=4),
    "sections": st.lists(st.fixed_dictionaries({}, optional={
        "content_type": st.text(max_size=30) | st.sampled_from(["text/plain",
                                                                 "application/json"]),
        "text": st.text(max_size=30) | JSONISH,
        "base64": st.text(max_size=30) | st.sampled_from(["aGk=", "!!"])}), max_size=3)})))
def test_a_publish_body_is_a_message_or_a_validation_error(body):
    serializer = s.PublishSerializer(data=body)
    if serializer.is_valid():
        message = serializer.message()
        for name, value in message.headers:
            assert "\r" not in value and "\n" not in value and ":" not in name
    else:
        assert serializer.errors


def test_idempotency_results_are_forgotten_after_the_retention(db):
    from api.models import IdempotencyKey
    from api.tasks import purge_idempotency_keys

    bob = make_account("bob")
    for key in ("old", "new"):
        IdempotencyKey.objects.create(account=bob, key=key, fingerprint="f", status=201,
                                      response={})
    IdempotencyKey.objects.filter(key="old").update(
        created=timezone.now() - timedelta(hours=25))
    assert purge_idempotency_keys() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


@pytest.mark.parametrize("value", [10**30, -1, True, "a\x00b", "x" * 2000])
def test_a_cursor_the_database_cannot_take_is_refused(value, rf):
    from rest_framework.request import Request

    request = Request(rf.get("/", {"cursor": pagination.encode(value)}))
    kind = str if isinstance(value, str) else int
    with pytest.raises(ValidationError):
        pagination.params(request, kind)


@pytest.fixture
def queue(db):
    """A queue topic ``/q`` bob subscribes to, 20 messages waiting for him, and a topic
    ``/h`` he may not see with one message."""
    topic = Topic.objects.create(path="/q", delivery_mode="queue", retry_timeout=30,
                                 max_retries=5)
    hidden = Topic.objects.create(path="/h")
    bob = make_account("bob")
    UALEntry.objects.create(topic=topic, principal_kind="account", account=bob,
                            right="subscribe")
    sub = Subscription.objects.create(account=bob, resource="MESSAGE", pattern="/q")
    smuids = []
    for i in range(20):
        message = Message.objects.create(topic=topic, cmuid=f"c{i}", created=timezone.now(),
                                         timeout=60)
        Delivery.objects.create(account=bob, message=message)
        smuids.append(message.pk)
    secret = Message.objects.create(topic=hidden, cmuid="h", created=timezone.now(),
                                    timeout=60)
    return bob, sub, smuids, secret.pk


def statements(run) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        result = run()
    return result, len(captured.captured_queries)


def test_a_pull_locks_what_it_takes_in_one_transaction_whatever_its_max(queue):
    bob, sub, smuids, _ = queue
    first = pull.pull(snapshot_for(bob), sub.pk, 1)  # (the caches of a first use, filled)
    two, few = statements(lambda: pull.pull(snapshot_for(bob), sub.pk, 2))
    sixteen, many = statements(lambda: pull.pull(snapshot_for(bob), sub.pk, 16))
    # In publish order, each once.
    assert [p.smuid for p in first + two + sixteen] == smuids[:19]
    assert {p.attempts for p in sixteen} == {1}
    assert many == few  # not one lock transaction per message
    held = Delivery.objects.filter(message_id__in=smuids[3:19], state="notified")
    assert {d.holder for d in held} == {pull.HOLDER_PREFIX + sixteen[0].receipt.split(".")[1]}


def test_a_batch_ack_is_one_transaction_and_answers_each_receipt(queue):
    bob, sub, smuids, secret = queue
    one = pull.pull(snapshot_for(bob), sub.pk, 1)
    got = pull.pull(snapshot_for(bob), sub.pk, 16)
    (outcomes, _), few = statements(lambda: pull.ack_many(snapshot_for(bob),
                                                          [one[0].receipt]))
    token = got[0].receipt.split(".")[1]
    Delivery.objects.filter(message_id=got[1].smuid).update(
        next_attempt=timezone.now() - timedelta(seconds=1))  # its lock has run out
    receipts = [p.receipt for p in got] + [got[0].receipt, f"{secret}.{token}",
                                            f"{smuids[-1] + 100}.{token}", "junk"]
    (outcomes, sent), many = statements(lambda: pull.ack_many(snapshot_for(bob), receipts))
    assert sent == []
    consumed, expired, unknown = (pull.Outcome.CONSUMED, pull.Outcome.EXPIRED,
                                  pull.Outcome.UNKNOWN)
    assert outcomes == [consumed, expired] + [consumed] * 14 + [expired] + [unknown] * 3
    assert [o.status for o in outcomes[:2]] == [204, 409] and unknown.status == 404
    # Sixteen receipts (and the refusals told apart) cost what one did, plus one look at
    # the refused messages' topics.
    assert many <= few + 1
    acked = Delivery.objects.filter(account=bob, state="acked")
    assert sorted(acked.values_list("message_id", flat=True)) == sorted(
        [one[0].smuid] + [p.smuid for p in got if p is not got[1]])


def test_a_batch_nack_releases_each_lock_it_holds(queue):
    bob, sub, _, _ = queue
    got = pull.pull(snapshot_for(bob), sub.pk, 2)
    outcomes, _ = pull.nack_many(snapshot_for(bob), [got[0].receipt, got[0].receipt, "x"])
    assert outcomes == [pull.Outcome.RELEASED, pull.Outcome.EXPIRED, pull.Outcome.UNKNOWN]
    [again] = pull.pull(snapshot_for(bob), sub.pk, 1)
    assert again.smuid == got[0].smuid and again.attempts == 2


def test_the_sweep_forgets_old_results_in_batches_until_none_is_left(db, monkeypatch):
    from functools import partial

    from api import tasks
    from api.models import IdempotencyKey

    bob = make_account("bob")
    for key in ("a", "b", "c", "d", "e", "new"):
        IdempotencyKey.objects.create(account=bob, key=key, fingerprint="f", status=201,
                                      response={})
    IdempotencyKey.objects.exclude(key="new").update(
        created=timezone.now() - timedelta(hours=25))
    monkeypatch.setattr(tasks, "purge_idempotency_keys",
                        partial(tasks.purge_idempotency_keys, limit=2))
    assert tasks.purge_idempotency_keys_task() == 5
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]
