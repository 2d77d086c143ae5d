"""The administrator's console (issue 5, part 3) through the Django test client: the topic tree,
the effective-rights page and its explanations, queue parameters with what they inherit, the
bulk grant, and the append-only audit log of every UAL change."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.urls import reverse

from accounts.models import Account
from tests.support.factories import make_account
from topics.models import Topic
from ual.models import UALAuditLog, UALEntry

pytestmark = pytest.mark.django_db

TREE = "/admin/topics/topic/tree/"
RIGHTS = "/admin/ual/ualentry/effective-rights/"
BULK = "/admin/ual/ualentry/bulk-grant/"


def make_topic(path: str, **kw) -> Topic:
    parent_path = path.rpartition("/")[0]
    parent = Topic.objects.get(key=parent_path.casefold()) if parent_path else None
    return Topic.objects.create(path=path, parent=parent, **kw)


def entry(topic: Topic, right: str, effect: str = "allow", *, account: Account | None = None,
          group: Group | None = None, kind: str | None = None) -> UALEntry:
    kind = kind or ("group" if group else "account" if account else "everyone")
    return UALEntry.objects.create(topic=topic, principal_kind=kind, account=account,
                                   group=group, right=right, effect=effect)


def rights_row(html: str, right: str) -> str:
    match = re.search(rf'<tr id="right-{right}".*?</tr>', html, re.S)
    assert match, f"no row for {right}"
    return match.group(0)


# --------------------------------------------------------------------------- index and tree


def test_index_links_the_console_pages(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert 'id="smqp-console"' in page
    for url in (TREE, RIGHTS, BULK, "/admin/ual/ualauditlog/"):
        assert f'href="{url}"' in page, url
    # The application list is still there.
    assert "/admin/topics/topic/" in page and "/admin/accounts/account/" in page


def test_topic_tree_shows_every_topic_indented_with_links_and_state(admin_client):
    stocks = make_topic("/stocks")
    quotes = make_topic("/stocks/quotes", max_retries=4)
    ibm = make_topic("/stocks/quotes/ibm")
    make_topic("/stocksx")
    news = make_topic("/news", link=stocks)
    gone = make_topic("/old", state=Topic.State.REMOVING)
    entry(quotes, "subscribe")
    page = admin_client.get(TREE).content.decode()
    rows = re.findall(r'<tr data-path="([^"]+)"', page)
    # Depth-first: children right after their parent (not "/stocksx" between them).
    assert rows.index("/stocks") < rows.index("/stocks/quotes") < rows.index(
        "/stocks/quotes/ibm") < rows.index("/stocksx")
    assert "/accounts/admin" in rows
    row = re.search(r'<tr data-path="/stocks/quotes/ibm".*?</tr>', page, re.S).group(0)
    assert "padding-left: 3.0em" in row
    assert f'href="/admin/topics/topic/{ibm.pk}/change/"' in row
    virtual = re.search(r'<tr data-path="/news".*?</tr>', page, re.S).group(0)
    assert "(virtual)" in virtual and f"/admin/topics/topic/{stocks.pk}/change/" in virtual
    assert news.pk
    removing = re.search(r'<tr data-path="/old".*?</tr>', page, re.S).group(0)
    assert '<span class="removing">removing</span>' in removing and gone.pk
    quotes_row = re.search(r'<tr data-path="/stocks/quotes".*?</tr>', page, re.S).group(0)
    assert "max_retries=4" in quotes_row
    assert f"?topic__id__exact={quotes.pk}\">1</a>" in quotes_row
    sub = admin_client.get(TREE, {"under": "/STOCKS"}).content.decode()
    assert re.findall(r'<tr data-path="([^"]+)"', sub) == [
        "/stocks", "/stocks/quotes", "/stocks/quotes/ibm"]


def test_console_pages_need_the_view_permission(client):
    clerk = make_account("clerk", is_staff=True)
    client.force_login(clerk)
    for url in (TREE, RIGHTS, BULK):
        assert client.get(url).status_code == 403, url


# ------------------------------------------------------------------------- effective rights


@pytest.fixture
def deep_tree():
    """/a/b/c with: at /a (depth 1) a deny of subscribe to group traders (bob is one) beside
    an allow of subscribe to everyone, and a deny of publish to everyone; at /a/b (depth 2) an
    allow of publish to bob. Nothing at /a/b/c itself."""
    bob = make_account("bob")
    traders = Group.objects.create(name="traders")
    bob.groups.add(traders)
    a = make_topic("/a")
    b = make_topic("/a/b")
    c = make_topic("/a/b/c")
    entries = {
        "deny_sub": entry(a, "subscribe", "deny", group=traders),
        "allow_sub": entry(a, "subscribe", "allow"),
        "deny_pub": entry(a, "publish", "deny"),
        "allow_pub": entry(b, "publish", "allow", account=bob),
    }
    return {"bob": bob, "c": c, **entries}


def test_effective_rights_explain_a_deny_at_depth_1_for_a_topic_at_depth_3(admin_client,
                                                                           deep_tree):
    page = admin_client.get(RIGHTS, {"account": "BOB", "topic": "/a/b/c"}).content.decode()
    row = rights_row(page, "subscribe")
    deny = deep_tree["deny_sub"]
    assert 'data-allowed="no"' in row
    assert 'data-level="/a"' in row and f'data-entry="{deny.pk}"' in row
    assert f'href="/admin/ual/ualentry/{deny.pk}/change/"' in row
    assert "(depth 1)" in row
    why = re.search(r'<td class="why">(.*?)</td>', row, re.S).group(1)
    assert f"Denied by entry #{deny.pk} (deny to group traders) at /a (depth 1)." in why
    assert "No entry at /a/b/c (depth 3), /a/b (depth 2) concerns bob for subscribe" in why
    assert "a deny beats an allow (allow to everyone)" in why
    # The walk shows the deciding entry at /a and nothing nearer.
    walk = re.search(r'<table id="ual-walk">.*?</table>', page, re.S).group(0)
    assert walk.count("(decides)") == 2  # subscribe and publish, one each
    level_a = re.search(r'<tr data-level="/a">.*?</tr>', walk, re.S).group(0)
    assert "deny · group traders (decides)" in level_a
    assert "allow · everyone" in level_a


def test_effective_rights_show_a_nearer_allow_overriding_a_farther_deny(admin_client,
                                                                       deep_tree):
    bob, c = deep_tree["bob"], deep_tree["c"]
    page = admin_client.get(RIGHTS, {"account": "bob", "topic": "/a/b/c"}).content.decode()
    row = rights_row(page, "publish")
    allow = deep_tree["allow_pub"]
    assert 'data-allowed="yes"' in row and 'data-level="/a/b"' in row
    assert f'data-entry="{allow.pk}"' in row and "(depth 2)" in row
    assert f"Allowed by entry #{allow.pk} (allow to account bob) at /a/b (depth 2)." in row
    assert "Farther up, overridden: deny to everyone at /a." in row
    # With no entry anywhere for a right: the root default.
    manage = rights_row(page, "manage")
    assert 'data-allowed="no"' in manage and 'data-level=""' in manage
    assert "the root default is deny" in manage
    # An entry on the topic itself is the nearest level.
    entry(c, "subscribe", "allow", account=bob)
    page = admin_client.get(RIGHTS, {"account": "bob", "topic": "/a/b/c"}).content.decode()
    row = rights_row(page, "subscribe")
    assert 'data-allowed="yes"' in row and 'data-level="/a/b/c"' in row
    assert "on the topic itself" in row


def test_effective_rights_explain_superuser_own_topic_disabled_and_virtual(admin_client,
                                                                          deep_tree):
    bob, c = deep_tree["bob"], deep_tree["c"]
    make_account("boss", is_superuser=True)
    page = admin_client.get(RIGHTS, {"account": "boss", "topic": "/a/b/c"}).content.decode()
    assert all('data-allowed="yes"' in rights_row(page, r) for r in ("manage", "remote"))
    assert "boss is a superuser" in page
    page = admin_client.get(RIGHTS, {"account": "bob",
                                     "topic": "/accounts/bob"}).content.decode()
    assert "always subscribe to its own account topic" in rights_row(page, "subscribe")
    assert 'data-allowed="no"' in rights_row(page, "publish")
    make_topic("/alias", link=c)
    page = admin_client.get(RIGHTS, {"account": "bob", "topic": "/alias"}).content.decode()
    assert "a virtual topic: its rights are those of" in page
    assert 'data-level="/a"' in rights_row(page, "subscribe")
    bob.is_active = False
    bob.save()
    page = admin_client.get(RIGHTS, {"account": "bob", "topic": "/a/b/c"}).content.decode()
    assert "bob is disabled" in rights_row(page, "publish")


def test_effective_rights_form_errors(admin_client):
    page = admin_client.get(RIGHTS, {"account": "nobody", "topic": "/nowhere"}).content.decode()
    assert "No account by that name." in page and "No topic at that path." in page
    assert 'id="effective-rights"' not in page


# ------------------------------------------------------------------------ queue parameters


def test_queue_parameters_show_what_empty_fields_inherit_and_from_where(admin_client, settings):
    q = make_topic("/q", max_retries=7)
    r = make_topic("/q/r", retry_timeout=12)
    page = admin_client.get(f"/admin/topics/topic/{r.pk}/change/").content.decode()
    assert "Empty: inherits 7 from /q." in page
    expiry = settings.SMQP_QUEUE_DEFAULTS["expiry_timeout"]
    assert f"Empty: inherits {expiry} from server default." in page
    assert "Empty: inherits unlimited from server default." in page  # max_queue_bytes
    table = re.search(r"<table id='queue-parameters'>.*?</table>", page, re.S).group(0)
    retry = re.search(r"<tr data-parameter='retry_timeout'>.*?</tr>", table).group(0)
    assert "<td>12</td><td>set here</td>" in retry and "overrides 30 from server default" in retry
    retries = re.search(r"<tr data-parameter='max_retries'>.*?</tr>", table).group(0)
    assert "<td>7</td><td>inherited from /q</td>" in retries
    add = admin_client.get("/admin/topics/topic/add/").content.decode()
    assert f"Empty: inherits {expiry} from server default." in add
    assert q.pk


# ------------------------------------------------------------------------------- bulk grant


def test_bulk_grant_gives_one_right_to_many_accounts(admin_client):
    bob, alice = make_account("bob"), make_account("alice")
    srv = make_account("srv", is_remote_server=True)
    stocks = make_topic("/stocks")
    make_topic("/shares", link=stocks)
    form = admin_client.get(BULK, {"accounts": f"{bob.pk},{alice.pk}", "topic": "/stocks"})
    html = form.content.decode()
    assert f'<option value="{bob.pk}" selected>' in html and 'value="/stocks"' in html
    reply = admin_client.post(BULK, {"topic": "/shares", "right": "subscribe",
                                     "effect": "allow",
                                     "accounts": [bob.pk, alice.pk, srv.pk]})
    assert reply.status_code == 302
    assert reply["Location"].startswith("/admin/ual/ualentry/?")
    rows = set(UALEntry.objects.values_list("topic__path", "principal_kind",
                                            "account__username", "right", "effect"))
    assert rows == {("/stocks", "account", "bob", "subscribe", "allow"),
                    ("/stocks", "account", "alice", "subscribe", "allow"),
                    ("/stocks", "server", "srv", "subscribe", "allow")}
    # Again with deny, for bob only: his entry changes, nothing else does.
    admin_client.post(BULK, {"topic": "/stocks", "right": "subscribe", "effect": "deny",
                             "accounts": [bob.pk]})
    assert UALEntry.objects.get(account=bob).effect == "deny"
    assert UALEntry.objects.filter(effect="allow").count() == 2
    log = list(UALAuditLog.objects.order_by("id").values_list("actor", "action"))
    assert log == [("admin", "created")] * 3 + [("admin", "changed")]
    bad = admin_client.post(BULK, {"topic": "/nope", "right": "fly", "effect": "allow"})
    assert bad.status_code == 200
    assert "No topic at that path." in bad.content.decode()
    assert UALEntry.objects.count() == 3


# -------------------------------------------------------------------------------- audit log


def test_admin_changes_are_audited_with_the_acting_user(admin_client):
    bob = make_account("bob")
    stocks = make_topic("/stocks")
    add = admin_client.post("/admin/ual/ualentry/add/", {
        "topic": stocks.pk, "right": "subscribe", "effect": "allow",
        "principal_kind": "account", "account": bob.pk, "group": ""})
    assert add.status_code == 302, add.content.decode()[:2000]
    created = UALEntry.objects.get()
    change = admin_client.post(f"/admin/ual/ualentry/{created.pk}/change/", {
        "topic": stocks.pk, "right": "subscribe", "effect": "deny",
        "principal_kind": "account", "account": bob.pk, "group": ""})
    assert change.status_code == 302
    delete = admin_client.post(f"/admin/ual/ualentry/{created.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 302 and not UALEntry.objects.exists()
    log = list(UALAuditLog.objects.order_by("id"))
    assert [(row.actor, row.action) for row in log] == [
        ("admin", "created"), ("admin", "changed"), ("admin", "deleted")]
    assert log[0].after == {"id": created.pk, "topic": "/stocks", "principal_kind": "account",
                            "account": "bob", "group": None, "right": "subscribe",
                            "effect": "allow"}
    assert log[1].before["effect"] == "allow" and log[1].after["effect"] == "deny"
    assert log[1].summary == ("allow subscribe to account bob on /stocks → "
                              "deny subscribe to account bob on /stocks")
    assert log[2].after is None and log[2].before["effect"] == "deny"
    assert all(row.entry_id == created.pk and row.topic == "/stocks" for row in log)


def test_topic_inline_and_topic_deletion_are_audited(admin_client):
    bob = make_account("bob")
    stocks = make_topic("/stocks")
    change_url = f"/admin/topics/topic/{stocks.pk}/change/"
    page = admin_client.get(change_url).content.decode()
    assert "ual_entries-TOTAL_FORMS" in page
    data = {
        "path": "/stocks", "parent": "", "link": "", "account": "", "state": "active",
        "delivery_mode": "fanout",
        **{name: "" for name in ("expiry_timeout", "retry_timeout", "max_retries",
                                 "max_message_count", "max_message_size", "max_queue_bytes")},
        "keywords-TOTAL_FORMS": "0", "keywords-INITIAL_FORMS": "0",
        "ual_entries-TOTAL_FORMS": "1", "ual_entries-INITIAL_FORMS": "0",
        "ual_entries-0-principal_kind": "account", "ual_entries-0-account": bob.pk,
        "ual_entries-0-group": "", "ual_entries-0-right": "publish",
        "ual_entries-0-effect": "allow",
    }
    reply = admin_client.post(change_url, data)
    assert reply.status_code == 302, reply.content.decode()[:3000]
    assert UALEntry.objects.filter(topic=stocks, right="publish").exists()
    admin_client.post(f"/admin/topics/topic/{stocks.pk}/delete/", {"post": "yes"})
    assert not Topic.objects.filter(pk=stocks.pk).exists()
    log = list(UALAuditLog.objects.order_by("id").values_list("actor", "action", "topic"))
    assert log == [("admin", "created", "/stocks"), ("admin", "deleted", "/stocks")]


def test_manage_py_grant_is_audited_as_such():
    make_account("bob")
    make_topic("/stocks")
    call_command("grant", "bob", "/stocks", "publish,subscribe")
    call_command("grant", "bob", "/stocks", "publish", "--deny")
    call_command("grant", "bob", "/stocks", "publish", "--deny")  # no change: no row
    call_command("grant", "bob", "/stocks", "subscribe", "--revoke")
    log = list(UALAuditLog.objects.order_by("id").values_list("actor", "action", "summary"))
    assert log == [
        ("manage.py grant", "created", "allow publish to account bob on /stocks"),
        ("manage.py grant", "created", "allow subscribe to account bob on /stocks"),
        ("manage.py grant", "changed", "allow publish to account bob on /stocks → "
                                       "deny publish to account bob on /stocks"),
        ("manage.py grant", "deleted", "allow subscribe to account bob on /stocks"),
    ]


def test_changes_from_other_code_are_audited_as_system():
    t = make_topic("/t")
    UALEntry.objects.create(topic=t, principal_kind="everyone", right="reply")
    assert UALAuditLog.objects.get().actor == "system"


def test_the_audit_log_cannot_be_changed_by_anyone(admin_client):
    make_account("bob")
    make_topic("/stocks")
    call_command("grant", "bob", "/stocks", "publish")
    row = UALAuditLog.objects.get()
    base = "/admin/ual/ualauditlog/"
    assert admin_client.get(base).status_code == 200
    view = admin_client.get(f"{base}{row.pk}/change/")
    assert view.status_code == 200
    html = view.content.decode()
    assert "manage.py grant" in html and 'name="_save"' not in html
    assert admin_client.post(f"{base}{row.pk}/change/", {"actor": "x"}).status_code == 403
    assert admin_client.get(f"{base}{row.pk}/delete/").status_code == 403
    assert admin_client.post(f"{base}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.get(f"{base}add/").status_code == 403
    actions = admin_client.post(base, {"action": "delete_selected", "_selected_action": row.pk})
    assert actions.status_code in (200, 302)
    assert UALAuditLog.objects.filter(pk=row.pk, actor="manage.py grant").exists()
    row.actor = "someone else"
    with pytest.raises(PermissionError):
        row.save()
    with pytest.raises(PermissionError):
        row.delete()
    with pytest.raises(PermissionError):
        UALAuditLog.objects.filter(pk=row.pk).update(actor="x")
    with pytest.raises(PermissionError):
        UALAuditLog.objects.all().delete()
    assert UALAuditLog.objects.get(pk=row.pk).actor == "manage.py grant"


def test_the_middleware_names_the_logged_in_user_for_changes_anywhere(rf, admin_user):
    from django.contrib.auth.models import AnonymousUser

    from ual.audit import AuditActorMiddleware

    t = make_topic("/t")

    def view(request):
        UALEntry.objects.create(topic=t, principal_kind="everyone", right=request.GET["right"])
        return None

    request = rf.get("/", {"right": "publish"})
    request.user = admin_user
    AuditActorMiddleware(view)(request)
    anonymous = rf.get("/", {"right": "reply"})
    anonymous.user = AnonymousUser()
    AuditActorMiddleware(view)(anonymous)
    assert list(UALAuditLog.objects.order_by("id").values_list("actor", flat=True)) == [
        "admin", "system"]


def test_account_action_opens_the_bulk_grant_with_the_selection(rf, admin_user):
    from django.contrib import admin

    from ual.admin import grant_right_on_topic

    admin.autodiscover()  # as broker/urls.py does (SimpleAdminConfig)
    bob, alice = make_account("bob"), make_account("alice")
    request = rf.post("/admin/accounts/account/")
    request.user = admin_user
    reply = grant_right_on_topic(admin.site._registry[Account], request,
                                 Account.objects.filter(pk__in=[bob.pk, alice.pk]))
    assert reply.status_code == 302
    assert reply["Location"] in (f"{BULK}?accounts={bob.pk}%2C{alice.pk}",
                                 f"{BULK}?accounts={alice.pk}%2C{bob.pk}")


def test_ual_entry_changelist_links_the_console(admin_client):
    page = admin_client.get(reverse("admin:ual_ualentry_changelist")).content.decode()
    assert f'href="{RIGHTS}"' in page and f'href="{BULK}"' in page and f'href="{TREE}"' in page
    topics = admin_client.get(reverse("admin:topics_topic_changelist")).content.decode()
    assert f'href="{TREE}"' in topics


def test_account_changelist_offers_the_bulk_grant_action(admin_client):
    """The action is on the account list, and choosing it for two accounts opens the bulk
    grant with both preselected."""
    bob, alice, zed = make_account("bob"), make_account("alice"), make_account("zed")
    url = reverse("admin:accounts_account_changelist")
    assert 'value="grant_right_on_topic"' in admin_client.get(url).content.decode()
    reply = admin_client.post(url, {"action": "grant_right_on_topic",
                                    "_selected_action": [bob.pk, alice.pk]})
    assert reply.status_code == 302
    form = admin_client.get(reply["Location"]).content.decode()
    for account in (bob, alice):
        assert f'<option value="{account.pk}" selected>{account.username}</option>' in form
    assert f'<option value="{zed.pk}">zed</option>' in form


def test_audit_middleware_is_installed(settings):
    auth = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    assert settings.MIDDLEWARE.index("ual.audit.AuditActorMiddleware") > auth
