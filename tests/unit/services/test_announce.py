"""A verb that commits announces itself (issue 38): REST's ack and nack and REPUBLISH tell
the subscriber sessions of every process (broker.services.notify.messages_committed) once
they commit, whichever door called them; the door does not."""

from __future__ import annotations

import pytest
from django.utils import timezone

from broker.models import Delivery, Message, Subscription
from broker.services import notify, publish, pull
from tests.support.factories import make_account
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import snapshot_for


@pytest.fixture
def announced(monkeypatch):
    """What messages_committed is called with, each call a list of (smuid, accounts)."""
    calls: list[list[tuple[int, list[int]]]] = []
    monkeypatch.setattr(notify, "messages_committed",
                        lambda published: calls.append(
                            [(p.smuid, list(p.accounts)) for p in published]))
    return calls


@pytest.fixture
def queue(db):
    """A fan-out topic ``/f`` bob may publish to and subscribes to, one message for him."""
    topic = Topic.objects.create(path="/f", retry_timeout=10, max_retries=5, expiry_timeout=60)
    bob = make_account("bob")
    for right in ("subscribe", "publish"):
        UALEntry.objects.create(topic=topic, principal_kind="account", account=bob, right=right)
    sub = Subscription.objects.create(account=bob, resource="MESSAGE", pattern="/f")
    message = Message.objects.create(topic=topic, cmuid="c1", created=timezone.now(),
                                     timeout=60)
    Delivery.objects.create(account=bob, message=message)
    return bob, sub, message


def test_a_nack_announces_the_message_it_moved_once_committed(
        queue, announced, django_capture_on_commit_callbacks):
    bob, sub, message = queue
    [got] = pull.pull(snapshot_for(bob), sub.pk, 1)
    with django_capture_on_commit_callbacks(execute=True):
        moved = pull.nack(snapshot_for(bob), got.receipt)
        assert announced == []  # not before the commit
    assert moved
    assert announced == [[(p.smuid, list(p.accounts)) for p in moved]]
    assert announced[0][0] == (message.pk, [bob.pk])


def test_an_ack_with_nothing_to_tell_announces_nothing(
        queue, announced, django_capture_on_commit_callbacks):
    bob, sub, _ = queue
    [got] = pull.pull(snapshot_for(bob), sub.pk, 1)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert pull.ack(snapshot_for(bob), got.receipt) == []  # no receipt asked for
    assert announced == [] and callbacks == []


def test_a_republish_announces_itself_once_committed(
        queue, announced, django_capture_on_commit_callbacks):
    bob, _, message = queue
    Delivery.objects.filter(message=message).delete()
    Message.objects.filter(pk=message.pk).update(state=Message.State.TRASH,
                                                 trashed=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        published = publish.republish(snapshot_for(bob), "/f", message.pk)
        assert announced == []
    assert published.accounts == [bob.pk]
    assert announced == [[(message.pk, [bob.pk])]]
