"""Selectors and leases in the services (in process): the rules the doors share. The wire
behaviour is in tests/test_e2e_selectors.py; here what is hard to reach from a socket: the
sweep against a given clock, queue mode choosing among selector subscriptions, the Celery
task, and the admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.domain.message import DataSection, Message
from broker.models import Delivery, Subscription
from broker.services import ServiceError, notify
from broker.services import publish as publish_service
from broker.services import subscriptions as subscription_service
from broker.services.deliveries import Sub, receivers
from broker.services.selectors import compile_selector, message_view
from broker.tasks import end_subscriptions as end_subscriptions_task
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

    def cancelled(self) -> list[tuple[str, str, str]]:
        return [(group, e["pattern"], e["reason"]) for group, e in self.sent
                if e.get("kind") == "subscription"]


@pytest.fixture
def layer(monkeypatch) -> RecordingLayer:
    recording = RecordingLayer()
    monkeypatch.setattr(notify, "get_channel_layer", lambda: recording)
    return recording


@pytest.fixture
def world():
    root = make_account("root", is_superuser=True)
    bob = make_account("bob")
    alice = make_account("alice")
    topic = Topic.objects.create(path="/s")
    for account in (bob, alice):
        UALEntry.objects.create(topic=topic, principal_kind="account", account=account,
                                right="subscribe")
    return root, bob, alice, topic


def publish(account_id: int, topic: str, cmuid: str, headers: list[tuple[str, str]]):
    return publish_service.publish(publish_service.PublishRequest(
        account_id=account_id, guid="sel001", kind="MESSAGE", topic=topic, cmuid=cmuid,
        message=Message(headers, [DataSection([("Content-Type", "text/plain")], b"x")])))


def sub(account, pattern: str, **kw) -> list[str]:
    from broker.domain.values import TopicPattern

    wildcard = pattern.endswith("/*")
    return subscription_service.subscribe(
        snapshot_for(account), "MESSAGE",
        TopicPattern(pattern[:-2] if wildcard else pattern, wildcard), **kw)


def test_publish_delivers_only_to_matching_selectors_once_per_account(world, layer):
    root, bob, alice, _ = world
    sub(bob, "/s", selector=("JMS", "X_N > 5"))
    sub(bob, "/s", selector=("LDAP", "(x-n=7)"))
    sub(alice, "/s", selector=("LDAP", "(x-n<=5)"))
    seven = publish(root.pk, "/s", "a", [("X-N", "7")])
    three = publish(root.pk, "/s", "b", [("X-N", "3")])
    none = publish(root.pk, "/s", "c", [("X-Other", "1")])
    assert seven.accounts == [bob.pk] and three.accounts == [alice.pk] and none.accounts == []
    assert Delivery.objects.filter(message_id=seven.smuid).count() == 1
    # Selected out by everyone: its timeout started at publish; the others wait for ACKs.
    from broker.models import Message as Row

    assert Row.objects.get(pk=none.smuid).expires is not None
    assert Row.objects.get(pk=seven.smuid).expires is None


def test_a_lease_ends_by_the_sweep_and_the_account_is_told(world, layer):
    _, bob, _, _ = world
    sub(bob, "/s", lease=2)
    sub(bob, "/s", selector=("JMS", "TRUE"))  # no lease: stays
    row = Subscription.objects.get(account=bob, selector_class="")
    assert row.lease_end is not None
    assert subscription_service.end_subscriptions(now=timezone.now()) == 0
    later = timezone.now() + timedelta(seconds=3)
    assert subscription_service.end_subscriptions(now=later) == 1
    assert layer.cancelled() == [(notify.account_group(bob.pk), "/s", "lease")]
    assert list(Subscription.objects.filter(account=bob).values_list("selector_class",
                                                                       flat=True)) == ["JMS"]
    # Run again (another process, or the Celery beat): nothing more, nobody told twice.
    assert subscription_service.end_subscriptions(now=later) == 0
    assert len(layer.cancelled()) == 1


def test_an_ended_lease_takes_nothing_even_before_the_sweep(world, layer):
    root, bob, _, _ = world
    sub(bob, "/s", lease=1)
    Subscription.objects.filter(account=bob).update(
        lease_end=timezone.now() - timedelta(seconds=1))
    assert publish(root.pk, "/s", "late", []).accounts == []


def test_renewal_moves_the_lease_end_and_plain_sub_lifts_it(world, layer):
    _, bob, _, _ = world
    sub(bob, "/s", lease=2)
    first = Subscription.objects.get(account=bob).lease_end
    sub(bob, "/s", lease=100)
    assert Subscription.objects.get(account=bob).lease_end > first + timedelta(seconds=50)
    sub(bob, "/s")
    assert Subscription.objects.get(account=bob).lease_end is None


def test_refusals(world, layer):
    _, bob, _, _ = world
    with pytest.raises(ServiceError) as caught:
        sub(bob, "/s", lease=0)
    assert caught.value.code == 400
    with pytest.raises(ServiceError) as caught:
        sub(bob, "/s", selector=("XPATH", "/a"))
    assert caught.value.code == 566
    with pytest.raises(ServiceError) as caught:
        sub(bob, "/s", selector=("JMS", "a ="))
    assert caught.value.code == 567 and caught.value.column == 4
    assert not Subscription.objects.filter(account=bob).exists()


def test_revocation_ends_the_subscription_once(world, layer):
    _, bob, alice, topic = world
    sub(bob, "/s")
    sub(alice, "/s", selector=("JMS", "TRUE"))
    UALEntry.objects.get(topic=topic, account=bob).delete()
    assert subscription_service.end_revoked(force=True) == 1
    assert layer.cancelled() == [(notify.account_group(bob.pk), "/s", "revoked")]
    assert subscription_service.end_revoked(force=True) == 0


def test_topic_removal_ends_subscriptions_on_it_and_below(world, layer):
    root, bob, alice, _ = world
    from broker.services import topics as topic_service

    topic_service.create_topic(snapshot_for(root), "/s/x")
    sub(bob, "/s/x")
    sub(alice, "/s/*")  # above the removed topic: stays
    topic_service.remove_topic(snapshot_for(root), "/s/x")
    assert layer.cancelled() == [(notify.account_group(bob.pk), "/s/x", "removed")]
    assert list(Subscription.objects.values_list("pattern", flat=True)) == ["/s/*"]


def test_queue_mode_picks_among_matching_selectors_only(world):
    _, bob, alice, topic = world
    subs = [Sub(bob.pk, None, compile_selector("JMS", "X_N = 1")),
            Sub(alice.pk, None, compile_selector("JMS", "X_N = 2"))]
    view = message_view(topic="/s", headers=[("X-N", "2")])
    assert receivers(subs, topic, timezone.now(), view) == [alice.pk]
    assert receivers(subs, topic, timezone.now(), lambda: view) == [alice.pk]
    # Without a view a selector takes nothing (never everything).
    assert receivers(subs, topic, timezone.now()) == []


def test_the_celery_task_runs_the_sweep(world, layer):
    _, bob, _, _ = world
    sub(bob, "/s", lease=1)
    Subscription.objects.filter(account=bob).update(
        lease_end=timezone.now() - timedelta(seconds=1))
    assert end_subscriptions_task() >= 1
    assert not Subscription.objects.filter(account=bob).exists()


def test_admin_lists_selector_and_lease_end_and_checks_selectors(world, client):
    root, bob, _, _ = world
    root.is_staff = True
    root.save()
    sub(bob, "/s", lease=3600, selector=("JMS", "X_Region = 'emea'"))
    client.force_login(root)
    page = client.get("/admin/broker/subscription/").content.decode()
    assert "JMS X_Region = &#x27;emea&#x27;" in page
    lease_end = Subscription.objects.get(account=bob).lease_end
    assert str(lease_end.year) in page and "Lease end" in page
    response = client.post("/admin/broker/subscription/add/", {
        "account": bob.pk, "resource": "MESSAGE", "pattern": "/s", "pattern_key": "",
        "selector_class": "JMS", "selector": "X_Region = "})
    # (The class is chosen from the two the broker supports.)
    assert response.status_code == 200
    assert "Incorrect message selector (unexpected end at column 11)" in \
        response.content.decode()


def test_queue_mode_publish_goes_to_one_matching_account(world, layer):
    root, bob, alice, topic = world
    Topic.objects.filter(pk=topic.pk).update(delivery_mode="queue")
    from topics import tree

    tree.changed()
    sub(bob, "/s", selector=("JMS", "X_N = 1"))
    sub(alice, "/s", selector=("JMS", "X_N = 2"))
    for n, account in ((1, bob), (2, alice), (2, alice), (1, bob)):
        published = publish(root.pk, "/s", f"q{n}", [("X-N", str(n))])
        assert published.accounts == [account.pk]
    assert publish(root.pk, "/s", "q3", [("X-N", "3")]).accounts == []


def test_a_lease_end_tells_the_subscribers_watchers_the_new_count(world, layer):
    root, bob, _, _ = world
    from broker.domain.values import TopicPattern

    subscription_service.subscribe(snapshot_for(root), "SUBSCRIBERS", TopicPattern("/s", False))
    sub(bob, "/s", lease=1)
    layer.sent.clear()
    assert subscription_service.end_subscriptions(
        now=timezone.now() + timedelta(seconds=2)) == 1
    counts = [e for group, e in layer.sent if e.get("kind") == "sub"]
    assert counts == [{"type": "smqp.notify", "kind": "sub", "topic": "/s", "count": 0}]
