"""Issue 23: the topic admin's pubsub#queueing field is the delivery mode ``queue``."""

from __future__ import annotations

import re

import pytest

from broker.services import pubsub
from tests.support.factories import make_account
from topics.models import Topic
from ual.resolution import AccessSnapshot

pytestmark = pytest.mark.django_db

FIELDS = ("expiry_timeout", "retry_timeout", "max_retries", "max_message_count",
          "max_message_size", "max_queue_bytes")


def form_data(path: str, mode: str, queueing: bool | None) -> dict:
    data = {"path": path, "parent": "", "link": "", "account": "", "state": "active",
            "delivery_mode": mode, **dict.fromkeys(FIELDS, ""),
            "keywords-TOTAL_FORMS": "0", "keywords-INITIAL_FORMS": "0",
            "ual_entries-TOTAL_FORMS": "0", "ual_entries-INITIAL_FORMS": "0",
            "pubsub_queueing_shown": "1"}
    if queueing:
        data["pubsub_queueing"] = "on"
    return data


def test_pubsub_queueing_field_sets_and_shows_the_queue_mode(admin_client):
    topic = Topic.objects.create(path="/jobs")
    url = f"/admin/topics/topic/{topic.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "pubsub#queueing" in page
    reply = admin_client.post(url, form_data("/jobs", "fanout", True))
    assert reply.status_code == 302, reply.content.decode()[:2000]
    topic.refresh_from_db()
    assert topic.delivery_mode == Topic.DeliveryMode.QUEUE
    # The XMPP node configuration reads the same setting.
    root = make_account("root", is_superuser=True)
    fields = dict((var, values) for var, _, values in
                  pubsub.node_config(AccessSnapshot(root), "/jobs"))
    assert fields["pubsub#queueing"] == ["1"]
    page = admin_client.get(url).content.decode()
    box = re.search(r"<input[^>]*name=\"pubsub_queueing\"[^>]*>", page)
    assert box is not None and "checked" in box.group(0)
    # Unticked: fan-out again; the delivery mode select alone still works as before.
    assert admin_client.post(url, form_data("/jobs", "queue", False)).status_code == 302
    topic.refresh_from_db()
    assert topic.delivery_mode == Topic.DeliveryMode.FANOUT
    assert admin_client.post(url, form_data("/jobs", "queue", True)).status_code == 302
    topic.refresh_from_db()
    assert topic.delivery_mode == Topic.DeliveryMode.QUEUE


def test_a_post_without_the_box_leaves_the_delivery_mode_alone(admin_client):
    topic = Topic.objects.create(path="/work", delivery_mode=Topic.DeliveryMode.QUEUE)
    url = f"/admin/topics/topic/{topic.pk}/change/"
    data = form_data("/work", "queue", None)
    del data["pubsub_queueing_shown"]
    assert admin_client.post(url, data).status_code == 302
    topic.refresh_from_db()
    assert topic.delivery_mode == Topic.DeliveryMode.QUEUE
