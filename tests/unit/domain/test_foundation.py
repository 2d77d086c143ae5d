"""The data model, its rules, the UAL decision, the management commands and the admin."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError

from accounts.models import Account
from broker.models import UsageEvent
from broker.services import topics as topic_service
from tests.support.factories import make_account
from topics import paths
from topics.models import Topic
from ual import check
from ual.models import UALEntry
from ual.resolution import decide

pytestmark = pytest.mark.django_db


def make_topic(path: str, **kw) -> Topic:
    parent = topic_service.find(paths.parent_path(path)) if paths.parent_path(path) else None
    return Topic.objects.create(path=path, parent=parent, **kw)


# --- accounts ---------------------------------------------------------------------------------


def test_creating_an_account_creates_its_account_topic():
    bob = make_account("Bob")
    topic = Topic.objects.get(account=bob)
    assert topic.path == "/accounts/Bob"
    assert topic.key == "/accounts/bob"
    assert topic.parent.path == "/accounts"


def test_renaming_an_account_renames_its_topic():
    bob = make_account("bob")
    bob.username = "robert"
    bob.save()
    assert Topic.objects.get(account=bob).path == "/accounts/robert"


def test_account_names_are_case_insensitively_unique():
    make_account("bob")
    with pytest.raises(IntegrityError):
        make_account("BOB")


@pytest.mark.parametrize("name", ["9lives", "has space", "dash-ed", "a/b", "", "_x"])
def test_account_names_must_be_topic_segments(name):
    with pytest.raises(ValidationError):
        Account(username=name).full_clean(exclude=["password", "username_key"])


def test_passwords_are_django_pbkdf2_hashes():
    bob = make_account("bob")
    assert bob.password.startswith("pbkdf2_sha256$")
    assert bob.check_password("pw") and not bob.check_password("PW")


# --- topics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/stocks", "/stocks/quotes/ibm", "/Ünïcode/ok_1", "/a1/b_2"])
def test_valid_paths(path):
    assert paths.check_creatable(path) == path


@pytest.mark.parametrize(
    "path", ["stocks", "/", "/1abc", "/a b", "/a//b", "/a/", "/a-b", "/a/Trash", "/TRASH/x", "/*"]
)
def test_invalid_or_reserved_paths(path):
    with pytest.raises(paths.InvalidTopicPath):
        paths.check_creatable(path)


def test_topic_keys_are_case_folded_and_unique():
    make_topic("/Stocks")
    assert topic_service.find("/STOCKS").path == "/Stocks"
    with pytest.raises(IntegrityError):
        make_topic("/stocks")


def test_virtual_topic_links_only_to_a_real_one():
    real = make_topic("/info")
    virtual = make_topic("/news", link=real)
    assert virtual.resolved() == real and str(virtual) == "/news > /info"
    chained = Topic(path="/chain", link=virtual)
    with pytest.raises(ValidationError):
        chained.full_clean()
    # A topic that others link to cannot itself become virtual.
    real.link = make_topic("/other")
    with pytest.raises(ValidationError):
        real.full_clean()


def test_queue_parameters_inherit_from_parent_then_server(settings):
    root = make_topic("/a", max_retries=7)
    child = make_topic("/a/b", retry_timeout=12)
    leaf = make_topic("/a/b/c")
    params = leaf.effective_parameters()
    assert params["max_retries"] == (7, "/a")
    assert params["retry_timeout"] == (12, "/a/b")
    assert params["expiry_timeout"] == (settings.SMQP_QUEUE_DEFAULTS["expiry_timeout"],
                                        "server default")
    assert root.effective_parameters()["retry_timeout"][1] == "server default"
    assert child.effective_parameters()["max_retries"] == (7, "/a")


# --- UAL --------------------------------------------------------------------------------------


def test_root_default_is_deny_but_own_account_topic_may_be_subscribed():
    bob = make_account("bob")
    make_account("alice")
    stocks = make_topic("/stocks")
    assert not check(bob, stocks, "publish")
    assert check(bob, Topic.objects.get(account=bob), "subscribe")
    assert not check(bob, topic_service.find("/accounts/alice"), "subscribe")
    assert not check(bob, Topic.objects.get(account=bob), "manage")


def test_nearest_entry_decides_and_deny_beats_allow_at_the_same_level():
    from django.contrib.auth.models import Group

    bob = make_account("bob")
    traders = Group.objects.create(name="traders")
    bob.groups.add(traders)
    stocks = make_topic("/stocks")
    quotes = make_topic("/stocks/quotes")
    ibm = make_topic("/stocks/quotes/ibm")
    UALEntry.objects.create(topic=stocks, principal_kind="everyone", right="subscribe")
    assert check(bob, ibm, "subscribe")
    UALEntry.objects.create(topic=quotes, principal_kind="group", group=traders,
                            right="subscribe", effect="deny")
    UALEntry.objects.create(topic=quotes, principal_kind="account", account=bob,
                            right="subscribe", effect="allow")
    decision = decide(bob, ibm, "subscribe")
    assert not decision.allowed and decision.level == "/stocks/quotes"
    assert decision.entry.effect == "deny"
    UALEntry.objects.create(topic=ibm, principal_kind="account", account=bob, right="subscribe")
    assert check(bob, ibm, "subscribe")
    assert not check(bob, quotes, "subscribe")


def test_virtual_topics_use_the_real_topics_entries():
    bob = make_account("bob")
    real = make_topic("/info")
    virtual = make_topic("/news", link=real)
    UALEntry.objects.create(topic=real, principal_kind="account", account=bob, right="publish")
    assert check(bob, virtual, "publish")


def test_superusers_may_do_everything_and_disabled_accounts_nothing():
    root = make_account("root", is_superuser=True)
    off = make_account("off", is_active=False)
    t = make_topic("/t")
    UALEntry.objects.create(topic=t, principal_kind="everyone", right="publish")
    assert check(root, t, "manage")
    assert not check(off, t, "publish")


def test_ual_entry_principal_must_match_its_kind():
    t = make_topic("/t")
    bob = make_account("bob")
    with pytest.raises(ValidationError):
        UALEntry(topic=t, principal_kind="server", account=bob, right="remote").full_clean()
    with pytest.raises(IntegrityError):
        UALEntry.objects.create(topic=t, principal_kind="everyone", account=bob, right="publish")


# --- usage events -----------------------------------------------------------------------------


def test_usage_events_are_append_only():
    event = UsageEvent.objects.create(kind="login", account="bob")
    event.kind = "logout"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()


# --- management commands ----------------------------------------------------------------------


def test_createaccount_and_grant(capsys):
    call_command("createaccount", "bob", "--password", "pw")
    call_command("createaccount", "admin", "--password", "pw", "--superuser")
    assert Account.objects.get(username="admin").is_superuser
    bob = Account.objects.get(username="bob")
    assert bob.check_password("pw")
    with pytest.raises(CommandError, match="already exists"):
        call_command("createaccount", "bob", "--password", "x")
    stocks = make_topic("/stocks")
    call_command("grant", "bob", "/STOCKS", "publish,subscribe")
    assert set(UALEntry.objects.filter(topic=stocks).values_list("right", "effect")) == {
        ("publish", "allow"), ("subscribe", "allow")}
    call_command("grant", "bob", "/stocks", "publish", "--deny")
    assert not check(bob, stocks, "publish")
    call_command("grant", "bob", "/stocks", "publish", "--revoke")
    assert UALEntry.objects.filter(topic=stocks, right="publish").count() == 0
    with pytest.raises(CommandError, match="unknown right"):
        call_command("grant", "bob", "/stocks", "fly")
    with pytest.raises(CommandError, match="no topic"):
        call_command("grant", "bob", "/nope", "publish")
    with pytest.raises(CommandError, match="no account"):
        call_command("grant", "nobody", "/stocks", "publish")


def test_bootstrapadmin_makes_one_superuser_once(settings, tmp_path, capsys):
    settings.VAR_DIR = tmp_path
    call_command("bootstrapadmin")
    password_file = tmp_path / "admin-password"
    password = password_file.read_text().strip()
    assert password and password in capsys.readouterr().out
    assert password_file.stat().st_mode & 0o777 == 0o600  # only the operator reads it
    admin = Account.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password(password)
    call_command("bootstrapadmin")  # a superuser exists: nothing new, the password kept
    assert Account.objects.filter(is_superuser=True).count() == 1
    assert password_file.read_text().strip() == password
    assert "admin login: admin / the password in" in capsys.readouterr().out
    assert Account.objects.get(username="admin").check_password(password)


def test_createaccount_rejects_names_that_cannot_be_topics():
    with pytest.raises(CommandError):
        call_command("createaccount", "9bad", "--password", "pw")
    assert not Account.objects.exists()


def test_runsmqp_explains_a_privileged_port(monkeypatch):
    from broker.management.commands import runsmqp

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(runsmqp, "run_event_loop", lambda coro: (coro.close(), refuse())[1])
    with pytest.raises(CommandError, match=r"not permitted.*--port 7200"):
        call_command("runsmqp", "--port", "720")


# --- admin ------------------------------------------------------------------------------------


def test_every_admin_page_works_on_a_fresh_database(client):
    from django.contrib import admin

    admin.autodiscover()  # as broker/urls.py does (SimpleAdminConfig): the whole registry
    assert len(admin.site._registry) > 10
    root = make_account("root", is_superuser=True, is_staff=True)
    client.force_login(root)
    t = make_topic("/t", max_retries=3)
    for model in admin.site._registry:
        meta = model._meta
        base = f"/admin/{meta.app_label}/{meta.model_name}/"
        assert client.get(base).status_code == 200, base
        add = client.get(base + "add/").status_code
        assert add in (200, 403), base
    page = client.get(f"/admin/topics/topic/{t.pk}/change/")
    assert page.status_code == 200
    assert b"max_retries" in page.content and b"server default" in page.content


def test_removed_topic_is_deleted_only_when_its_queue_is_empty():
    from django.utils import timezone

    from broker.models import Message
    from broker.tasks import finalize_topic_removals
    from ual.resolution import AccessSnapshot

    root = make_account("root", is_superuser=True)
    snap = AccessSnapshot(root)
    topic_service.create_topic(snap, "/q")
    topic_service.create_topic(snap, "/q/child")
    msg = Message.objects.create(topic=topic_service.find("/q/child"), cmuid="A1",
                                 created=timezone.now())
    assert topic_service.remove_topic(snap, "/q") == 1
    assert topic_service.find("/q").state == Topic.State.REMOVING
    assert finalize_topic_removals() == 0
    assert topic_service.find("/q/child") is not None
    Message.objects.filter(pk=msg.pk).update(state=Message.State.TRASH)
    assert finalize_topic_removals() == 2
    assert topic_service.find("/q") is None and topic_service.find("/q/child") is None


def test_queue_mode_moves_unacked_messages_on_then_to_trash():
    from datetime import timedelta

    from django.utils import timezone

    from broker.models import Delivery, Message, Subscription
    from broker.services import locks, sweeps
    from broker.services import publish as publish_service
    from broker.smqp.message import DataSection
    from broker.smqp.message import Message as Wire
    from broker.tasks import expire_queue_locks, requeue_queue_deliveries

    root = make_account("root", is_superuser=True)
    bob, alice = make_account("bob"), make_account("alice")
    q = make_topic("/work", delivery_mode="queue", retry_timeout=10, max_retries=2)
    for who in (bob, alice):
        UALEntry.objects.create(topic=q, principal_kind="account", account=who,
                                right="subscribe")
        Subscription.objects.create(account=who, resource="MESSAGE", pattern="/work")
    [published] = publish_service.publish_batch([publish_service.PublishRequest(
        account_id=root.pk, guid="root0001", kind="MESSAGE", topic="/work", cmuid="J1",
        message=Wire([], [DataSection([("Content-Type", "text/plain")], b"job")]))])
    assert len(published.accounts) == 1  # exactly one subscriber holds it
    first = published.accounts[0]
    other = alice.pk if first == bob.pk else bob.pk
    assert requeue_queue_deliveries() == 0 and expire_queue_locks() == 0  # not stale yet
    later = timezone.now() + timedelta(seconds=11)
    # Waiting, never sent, past the retry timeout: the other account's turn; no attempt.
    assert sweeps.requeue_stale_queue_deliveries(later) == 1
    waiting = Delivery.objects.get(message_id=published.smuid)
    assert waiting.account_id == other and waiting.attempts == 0
    # Each lock (a NOTIFY) counts an attempt; one that ends without an ACK moves it on.
    assert locks.lock(other, "s1", published.smuid, 10, 2)
    assert locks.expire_locks(later + timedelta(seconds=11)) == 1
    holder = Delivery.objects.get(message_id=published.smuid)
    assert holder.account_id == first and holder.attempts == 1
    assert locks.lock(first, "s2", published.smuid, 10, 2)
    assert locks.expire_locks(later + timedelta(seconds=22)) == 1
    assert Delivery.objects.get(message_id=published.smuid).account_id == other
    assert locks.lock(other, "s3", published.smuid, 10, 2)
    # The third time round, max retries (2) are spent: dead, and the message goes to Trash.
    assert locks.expire_locks(later + timedelta(seconds=33)) == 1
    assert Delivery.objects.get(message_id=published.smuid).state == "dead"
    assert Message.objects.get(pk=published.smuid).state == "trash"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("durability", ["relaxed", "full"])
def test_ack_commits_skip_the_flush_unless_full_and_restore_it(settings, durability):
    """SQLite: an ACK batch commits with synchronous=NORMAL (no fsync) and puts the configured
    level back; with SMQP_ACK_DURABILITY=full it is flushed like everything else."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from broker.models import Delivery
    from broker.services import ack as ack_service
    from broker.services import publish as publish_service
    from broker.smqp.message import DataSection
    from broker.smqp.message import Message as Wire

    settings.SMQP_ACK_DURABILITY = durability
    root = make_account("root", is_superuser=True)
    make_topic("/acks")
    [published] = publish_service.publish_batch([publish_service.PublishRequest(
        account_id=root.pk, guid="root0001", kind="MESSAGE", topic="/acks", cmuid="A1",
        message=Wire([], [DataSection([("Content-Type", "text/plain")], b"x")]))])
    with CaptureQueriesContext(connection) as seen:
        ack_service.ack_batch([ack_service.AckRequest(root.pk, published.smuid, 1)])
    pragmas = [q["sql"] for q in seen.captured_queries if q["sql"].startswith("PRAGMA sync")]
    if durability == "relaxed":
        assert pragmas == ["PRAGMA synchronous=NORMAL",
                           f"PRAGMA synchronous={settings.SMQP_SQLITE_SYNCHRONOUS}"]
    else:
        assert pragmas == []
    assert Delivery.objects.get(account=root, message_id=published.smuid).state == "acked"
    with connection.cursor() as cursor:
        level = cursor.execute("PRAGMA synchronous").fetchone()[0]
    assert level == {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}[
        settings.SMQP_SQLITE_SYNCHRONOUS]


def test_lean_rows_store_values_as_the_orm_would():
    """broker.store.rows writes datetimes and JSON in exactly the form Django's backend
    writes them, so ORM lookups (expires__lte=now, ordering) see no difference."""
    from datetime import UTC, datetime, timedelta, timezone

    from django.db import connection

    from broker.store import rows

    zones = (UTC, timezone(timedelta(hours=5, minutes=30)))
    for tz in zones:
        for micro in (0, 123456):
            value = datetime(2026, 11, 22, 12, 30, 5, micro, tzinfo=tz)
            assert rows.db_datetime(value) == connection.ops.adapt_datetimefield_value(value)
    headers = [["X-Name", "värde"], ["Content-Type", "text/plain"]]
    assert rows.db_json(headers) == connection.ops.adapt_json_value(headers, None)
    assert rows.db_datetime(None) is None
