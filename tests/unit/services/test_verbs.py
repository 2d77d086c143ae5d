"""The single-message forms of the hot verbs (what a REST view calls), the announcement of
committed messages through ``services/notify``, and the fresh-cache rule that every service
function refusing from a cache gets (``services/freshness``)."""

from __future__ import annotations

import time

import pytest

from broker.domain.message import DataSection, Message
from broker.models import Delivery, Subscription
from broker.services import ServiceError, freshness, notify
from broker.services import ack as ack_service
from broker.services import publish as publish_service
from broker.services import topics as topic_service
from tests.support.factories import make_account
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import snapshot_for

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingLayer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    async def group_send(self, group: str, event: dict) -> None:
        self.sent.append((group, event))


@pytest.fixture
def layer(monkeypatch) -> RecordingLayer:
    recording = RecordingLayer()
    monkeypatch.setattr(notify, "get_channel_layer", lambda: recording)
    return recording


def request(account_id: int, topic: str, cmuid: str) -> publish_service.PublishRequest:
    return publish_service.PublishRequest(
        account_id=account_id, guid="verbs001", kind="MESSAGE", topic=topic, cmuid=cmuid,
        message=Message([("Receipt", "YES")], [DataSection([("Content-Type", "text/plain")],
                                                           b"x")]))


def test_one_publish_and_its_ack_commit_and_are_announced_to_the_dispatchers(layer):
    root = make_account("root", is_superuser=True)
    bob = make_account("bob")
    topic = Topic.objects.create(path="/verbs")
    UALEntry.objects.create(topic=topic, principal_kind="account", account=bob,
                            right="subscribe")
    Subscription.objects.create(account=bob, resource="MESSAGE", pattern="/verbs")
    root_topic = Topic.objects.get(account=root)
    Subscription.objects.create(account=root, resource="MESSAGE", pattern=root_topic.path)

    before = time.time()
    published = publish_service.publish(request(root.pk, "/verbs", "V1"))
    assert published.accounts == [bob.pk]
    assert Delivery.objects.filter(account=bob, message_id=published.smuid).exists()
    # Stamped with when it was sent: a dispatcher judges by it how late it comes.
    stamps = [event.pop("at") for _, event in layer.sent]
    assert len(stamps) == 1 and before <= stamps[0] <= time.time()
    wake = {"type": "dispatch.wake", "origin": "",
            "items": [[published.priority, published.smuid, [bob.pk]]]}
    assert layer.sent == [(notify.DISPATCH_GROUP, wake)]

    # Its first ACK sends the receipt the message asked for, announced in turn.
    [receipt] = ack_service.ack(ack_service.AckRequest(bob.pk, published.smuid))
    assert receipt.topic_id == root_topic.pk and receipt.accounts == [root.pk]
    assert Delivery.objects.get(account=bob, message_id=published.smuid).state == "acked"
    assert layer.sent[-1][1].pop("at") >= stamps[0]
    assert layer.sent[-1] == (notify.DISPATCH_GROUP, {
        "type": "dispatch.wake", "origin": "",
        "items": [[receipt.priority, receipt.smuid, [root.pk]]]})


def test_a_refused_publish_raises_and_announces_nothing(layer):
    root = make_account("root", is_superuser=True)
    with pytest.raises(ServiceError) as refused:
        publish_service.publish(request(root.pk, "/nowhere", "V2"))
    assert refused.value.code == 404
    assert layer.sent == []


def test_a_refusal_from_stale_caches_is_answered_again_with_a_fresh_snapshot(monkeypatch):
    bob = make_account("bob")
    Topic.objects.create(path="/fresh")
    seen = []

    @freshness.answer_from_fresh_caches
    def look(snapshot, path: str) -> str:
        seen.append(snapshot)
        if len(seen) == 1:
            raise ServiceError(404, "Not found (topic)")
        return path

    monkeypatch.setattr(freshness, "caches_were_stale", lambda: True)
    first = snapshot_for(bob)
    assert look(first, "/fresh") == "/fresh"
    assert len(seen) == 2 and seen[1].account.pk == bob.pk

    # Current caches: the refusal stands, and the function ran once.
    seen.clear()
    monkeypatch.setattr(freshness, "caches_were_stale", lambda: False)
    with pytest.raises(ServiceError):
        look(first, "/fresh")
    assert len(seen) == 1

    # Not a refusal a cache could have made: never asked again.
    monkeypatch.setattr(freshness, "caches_were_stale", lambda: pytest.fail("asked"))
    with pytest.raises(ServiceError):
        topic_service.create_topic(snapshot_for(bob), "/Trash")
