"""ResourceID claims (broker.services.qqp_resources) in the publish batch's transaction
(broker.services.publish): one stored message per publisher and ResourceID."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.domain.message import DataSection, Message
from broker.models import Message as MessageRow
from broker.models import QQPResource
from broker.services import ServiceError, notify, qqp_resources
from broker.services import publish as publish_service
from tests.support.factories import make_account
from topics.models import Topic

pytestmark = pytest.mark.django_db(transaction=True)


class _Layer:
    async def group_send(self, group: str, event: dict) -> None:
        pass


def _item(account, rid: str, topic: str | None = None) -> publish_service.PublishRequest:
    return publish_service.PublishRequest(
        account_id=account.pk, guid="", kind="MESSAGE",
        topic=topic or f"/accounts/{account.username}", cmuid=rid,
        message=Message([], [DataSection([("Content-Type", "text/plain")], rid.encode())]),
        door="qqp", resource_id=rid)


def _claims(account) -> dict[str, int | None]:
    return dict(QQPResource.objects.filter(account=account).values_list("resource_id", "smuid"))


def test_a_batch_stores_each_resource_id_once_with_its_claim():
    root = make_account("root", is_superuser=True, is_staff=True)
    feeder = make_account("feeder", is_superuser=True, is_staff=True)
    topic = f"/accounts/{root.username}"
    # The original and its replay in one batch, another ResourceID, the same ResourceID of
    # another publisher (per publisher), and a replay after a refused first item.
    results = publish_service.publish_batch([
        _item(root, "a"), _item(root, "a"), _item(root, "b"), _item(feeder, "a", topic),
        _item(root, "c", "/nowhere"), _item(root, "c")])
    first, replay, other, feeders, nowhere, second_c = results
    assert isinstance(first, publish_service.Published)
    assert replay == qqp_resources.Redundant(first.smuid)
    assert isinstance(other, publish_service.Published)
    assert isinstance(feeders, publish_service.Published)
    assert isinstance(nowhere, ServiceError) and nowhere.code == 404
    assert isinstance(second_c, publish_service.Published)
    assert _claims(root) == {"a": first.smuid, "b": other.smuid, "c": second_c.smuid}
    assert _claims(feeder) == {"a": feeders.smuid}
    # A later batch: replays are Redundant, nothing more is stored.
    again = publish_service.publish_batch([_item(root, "b"), _item(root, "a")])
    assert again == [qqp_resources.Redundant(other.smuid), qqp_resources.Redundant(first.smuid)]
    assert MessageRow.objects.count() == 4
    # Plain publishes (no ResourceID) are not claimed, however often their Cmuid comes.
    plain = _item(root, "a")
    plain.resource_id = None
    assert isinstance(publish_service.publish_batch([plain])[0], publish_service.Published)
    assert MessageRow.objects.count() == 5


def test_past_the_retention_a_resource_id_is_new_and_forgotten(settings):
    settings.SMQP_QQP_DEDUP_DAYS = 7
    root = make_account("root", is_superuser=True, is_staff=True)
    [first] = publish_service.publish_batch([_item(root, "r")])
    QQPResource.objects.update(received=timezone.now() - timedelta(days=8))
    assert qqp_resources.forget_old() == 1
    [again] = publish_service.publish_batch([_item(root, "r")])
    assert isinstance(again, publish_service.Published) and again.smuid != first.smuid
    QQPResource.objects.update(received=timezone.now() - timedelta(days=8))
    # The forgotten row is taken over, not left behind.
    [third] = publish_service.publish_batch([_item(root, "r")])
    assert isinstance(third, publish_service.Published)
    assert _claims(root) == {"r": third.smuid}
    assert QQPResource.objects.get().received > timezone.now() - timedelta(minutes=1)


def test_a_refused_item_leaves_no_claim_and_its_replays_share_the_refusal():
    root = make_account("root", is_superuser=True, is_staff=True)
    topic = Topic.objects.get(path=f"/accounts/{root.username}")
    topic.max_message_count = 1
    topic.save()
    [kept] = publish_service.publish_batch([_item(root, "k")])
    assert isinstance(kept, publish_service.Published)
    over, replay = publish_service.publish_batch([_item(root, "full"), _item(root, "full")])
    assert isinstance(over, ServiceError) and over.code == 414
    assert replay is over
    assert _claims(root) == {"k": kept.smuid}  # no claim left for "full": it may come again


def test_a_claim_without_an_smuid_is_settled_by_the_stored_message(monkeypatch):
    """Rows an earlier door left (its claim committed before its publish)."""
    monkeypatch.setattr(notify, "get_channel_layer", lambda: _Layer())
    root = make_account("root", is_superuser=True, is_staff=True)
    plain = _item(root, "gone")
    plain.resource_id = None
    stored = publish_service.publish(plain)
    QQPResource.objects.create(account=root, resource_id="gone", smuid=None,
                               received=timezone.now())
    QQPResource.objects.create(account=root, resource_id="lost", smuid=None,
                               received=timezone.now())
    gone, lost = publish_service.publish_batch([_item(root, "gone"), _item(root, "lost")])
    assert gone == qqp_resources.Redundant(stored.smuid)
    assert isinstance(lost, publish_service.Published)  # nothing stored under it: taken over
    assert _claims(root) == {"gone": None, "lost": lost.smuid}


def test_unsigned_refusal_names_the_setting_that_decides(settings):
    settings.SMQP_QQP_UNSIGNED_ACCOUNT = ""
    settings.SMQP_QQP_UNSIGNED_FROM = "loopback"
    assert "SMQP_QQP_UNSIGNED_ACCOUNT is not set" in qqp_resources.unsigned_refusal("127.0.0.1")
    settings.SMQP_QQP_UNSIGNED_ACCOUNT = "feeder"
    assert qqp_resources.unsigned_refusal("127.0.0.1") is None
    assert "SMQP_QQP_UNSIGNED_FROM" in qqp_resources.unsigned_refusal("192.0.2.7")
