"""ResourceID claims (broker.services.qqp_resources): one publish per ResourceID."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.domain.message import DataSection, Message
from broker.models import QQPResource
from broker.services import notify, qqp_resources
from broker.services import publish as publish_service
from tests.support.factories import make_account

pytestmark = pytest.mark.django_db(transaction=True)


class _Layer:
    async def group_send(self, group: str, event: dict) -> None:
        pass


def test_claim_stored_duplicate_busy_release_and_retention(settings):
    settings.SMQP_QQP_DEDUP_DAYS = 7
    account = make_account("feeder")
    assert qqp_resources.claim(account.pk, "r") is None
    assert qqp_resources.claim(account.pk, "r") == qqp_resources.BUSY
    qqp_resources.release(account.pk, "r")
    assert qqp_resources.claim(account.pk, "r") is None
    qqp_resources.stored(account.pk, "r", 42)
    assert qqp_resources.claim(account.pk, "r") == 42
    other = make_account("other")
    assert qqp_resources.claim(other.pk, "r") is None  # per publisher
    QQPResource.objects.filter(account=account).update(
        received=timezone.now() - timedelta(days=8))
    assert qqp_resources.claim(account.pk, "r") is None  # past the retention: new
    assert qqp_resources.forget_old() == 0
    QQPResource.objects.filter(account=other).update(received=timezone.now() - timedelta(days=8))
    assert qqp_resources.forget_old() == 1


def test_a_stale_claim_is_resolved_by_the_stored_message(monkeypatch):
    monkeypatch.setattr(notify, "get_channel_layer", lambda: _Layer())
    root = make_account("root", is_superuser=True, is_staff=True)
    assert qqp_resources.claim(root.pk, "gone") is None
    stale = timezone.now() - qqp_resources.STALE_CLAIM - timedelta(seconds=1)
    QQPResource.objects.update(received=stale)
    # Nothing was stored under the stale claim: it is taken over.
    assert qqp_resources.claim(root.pk, "gone") is None
    # Stored, but the smuid never recorded: the message is found by its Cmuid.
    published = publish_service.publish(publish_service.PublishRequest(
        account_id=root.pk, guid="", kind="MESSAGE", topic=f"/accounts/{root.username}",
        cmuid="gone", message=Message([], [DataSection([("Content-Type", "text/plain")],
                                                       b"x")])))
    QQPResource.objects.update(received=stale)
    assert qqp_resources.claim(root.pk, "gone") == published.smuid


def test_unsigned_refusal_names_the_setting_that_decides(settings):
    settings.SMQP_QQP_UNSIGNED_ACCOUNT = ""
    settings.SMQP_QQP_UNSIGNED_FROM = "loopback"
    assert "SMQP_QQP_UNSIGNED_ACCOUNT is not set" in qqp_resources.unsigned_refusal("127.0.0.1")
    settings.SMQP_QQP_UNSIGNED_ACCOUNT = "feeder"
    assert qqp_resources.unsigned_refusal("127.0.0.1") is None
    assert "SMQP_QQP_UNSIGNED_FROM" in qqp_resources.unsigned_refusal("192.0.2.7")
