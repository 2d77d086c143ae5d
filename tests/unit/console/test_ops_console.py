"""Issue 30: the console's pages and /metrics as Django serves them: who may see and change
what, and a fuzz test of every value they take from a request (never a server error)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import Account, LoginSession
from tests.support.examples import examples
from topics.models import Topic

pytestmark = pytest.mark.django_db

FUZZ = settings(max_examples=examples(60), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)


@pytest.fixture
def news(db) -> Topic:
    return Topic.objects.create(path="/news")


def test_pages_are_staff_only(client, news):
    for url in ("/admin/ops/overview.json", "/admin/ops/topic/?path=/news",
                "/admin/ops/sessions/"):
        reply = client.get(url)
        assert reply.status_code == 302 and "/admin/login/" in reply["Location"], url


def test_changes_need_their_model_permission(client, news):
    staff = Account.objects.create(username="clerk", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/ops/topic/?path=/news").status_code == 200
    assert client.post("/admin/ops/sessions/", {"guid": "x"}).status_code == 403
    assert client.post("/admin/ops/republish/", {"smuid": "1"}).status_code == 403
    assert client.post("/admin/ops/topic/?path=/news", {"body": "x"}).status_code == 403


def test_overview_json_and_index(admin_client, news):
    snap = admin_client.get("/admin/ops/overview.json").json()
    assert set(snap) >= {"rates", "totals", "topics", "sessions", "dead_letters",
                         "group_commits", "listeners", "links"}
    assert len(snap["rates"]["minutes"]["publish"]) == 60
    assert len(snap["rates"]["hours"]["ack"]) == 24
    page = admin_client.get("/admin/").content.decode()
    assert 'id="ops-overview"' in page and "app-accounts" in page  # the app list stays


def test_close_unknown_session_is_a_warning(admin_client):
    reply = admin_client.post("/admin/ops/sessions/", {"guid": "nobody0001"}, follow=True)
    assert "No live session nobody0001" in reply.content.decode()


def test_test_publish_refusal_is_shown(client, news):
    # A staff account with the model permission but no right on the topic: the
    # publish service refuses, as over SMQP.
    from django.contrib.auth.models import Permission

    clerk = Account.objects.create(username="clerk", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="add_message"))
    client.force_login(clerk)
    page = client.post("/admin/ops/topic/?path=/news", {"path": "/news", "body": "hi"},
                       follow=True).content.decode()
    assert "Refused, as over SMQP: 404" in page  # he cannot even see it


@override_settings(SMQP_METRICS="off")
def test_metrics_off_is_404(admin_client):
    assert admin_client.get("/metrics").status_code == 404


@override_settings(SMQP_METRICS="open")
def test_metrics_open(client):
    reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply["Content-Type"].startswith("text/plain")


@override_settings(SMQP_METRICS="staff", SMQP_METRICS_ALLOW="10.0.0.0/8, loopback")
def test_metrics_allowed_addresses(client):
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.1").status_code == 403


@override_settings(SMQP_METRICS="staff", SMQP_METRICS_TOKEN="s3cret")
def test_metrics_staff_or_token(client, admin_client):
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cre").status_code == 403
    assert admin_client.get("/metrics").status_code == 200


@FUZZ
@given(path=TEXT)
def test_fuzz_topic_pages(admin_client, path):
    for url in ("/admin/ops/topic/", "/admin/ops/topic.json"):
        assert admin_client.get(url, {"path": path}).status_code in (200, 404)


def test_republish_never_redirects_off_the_site(admin_client):
    for nxt in ("//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"):
        reply = admin_client.post("/admin/ops/republish/", {"smuid": "1", "next": nxt})
        assert reply["Location"] == "/admin/", nxt
    reply = admin_client.post("/admin/ops/republish/", {"smuid": "1", "next": "/admin/?x=1"})
    assert reply["Location"] == "/admin/?x=1"


@FUZZ
@given(smuid=TEXT, guid=TEXT, nxt=TEXT)
def test_fuzz_console_posts(admin_client, smuid, guid, nxt):
    reply = admin_client.post("/admin/ops/republish/", {"smuid": smuid, "next": nxt})
    assert reply.status_code == 302
    location = reply["Location"]
    assert location.startswith("/") and not location.startswith(("//", "/\\"))  # on the site
    assert admin_client.post("/admin/ops/sessions/", {"guid": guid}).status_code == 302
    assert not LoginSession.objects.filter(ended__isnull=False).exists()


@FUZZ
@given(path=TEXT, body=st.binary(max_size=200).map(lambda b: b.decode("latin-1")), name=TEXT)
def test_fuzz_test_publish(admin_client, news, path, body, name):
    reply = admin_client.post("/admin/ops/topic/?path=" + "/news",
                              {"path": "/news", "body": body, "name": name})
    assert reply.status_code == 302


@FUZZ
@given(header=TEXT, addr=TEXT)
def test_fuzz_metrics_auth(client, header, addr):
    with override_settings(SMQP_METRICS="staff", SMQP_METRICS_TOKEN="tok",
                           SMQP_METRICS_ALLOW="loopback"):
        reply = client.get("/metrics", HTTP_AUTHORIZATION=header, REMOTE_ADDR=addr)
    assert reply.status_code in (200, 403)


def test_redis_away_the_store_figures_still_show(admin_client, news, monkeypatch):
    """The listeners' counters live in Redis; without it the overview and /metrics still
    answer with what the store holds, and say the counters are missing."""
    import redis
    from prometheus_client.parser import text_string_to_metric_families

    from broker.store import opsmetrics

    def down(*args, **kwargs):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(opsmetrics, "totals", down)
    monkeypatch.setattr(opsmetrics, "series", down)
    snap = admin_client.get("/admin/ops/overview.json").json()
    assert snap["counters_unavailable"].startswith("Redis: ")
    assert snap["rates"]["minutes"]["publish"] == [0] * 60
    assert snap["sessions"] == {"total": 0, "by_door": {}}
    names = {f.name: f for f in text_string_to_metric_families(
        admin_client.get("/metrics").content.decode())}
    assert names["smqp_counters_up"].samples[0].value == 0
    assert "smqp_sessions" in names and "smqp_messages" not in names
