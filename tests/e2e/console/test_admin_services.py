"""Issue 22 item 3: the admin follows the topic rules. Its topic pages call the same topic
services as SMQP (a rename moves the subtree, a delete is REMOVE TOPIC, every change is told
to TOPIC subscribers, a refusal is a form error), and its message list can take messages into
Trash as REMOVE MESSAGE does.

A real Daphne serves the admin over HTTP (logged in with a superuser, CSRF token and all, the
forms filled in as a browser would send them) against the database of a real ``runsmqp``,
which SMQP sessions watch.
"""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest

from tests.conftest import (
    BrokerProcess,
    accounts_script,
    daphne,
    fresh_database,
    listener,
    run_manage,
)
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled, wait_until

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from broker.services import topics as ts
from topics.models import Topic
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for path in ['/shop', '/shop/a', '/shop/a/deep', '/shop/b', '/gone', '/state']:
    ts.create_topic(snap, path)
# A message's timeout starts at its ACK: here it runs out at once.
Topic.objects.filter(path='/gone').update(expiry_timeout=0)
"""

TOPICS = "/admin/topics/topic/"


class FormFields(HTMLParser):
    """What a browser would submit from a page's forms as they stand: inputs (checked boxes
    only), selects (the selected option, else the first), textareas; the inline formsets'
    ``__prefix__`` templates left out."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._select: str | None = None
        self._chosen = False
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name") or ""
        if "__prefix__" in name:
            return
        if tag == "input" and name:
            kind = (a.get("type") or "text").lower()
            if kind in ("submit", "button", "image", "file", "reset"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self.fields[name] = a.get("value") or ("on" if kind == "checkbox" else "")
        elif tag == "select" and name:
            self._select, self._chosen = name, False
            self.fields[name] = ""
        elif tag == "option" and self._select is not None:
            if "selected" in a or (not self._chosen and not self.fields[self._select]):
                self.fields[self._select] = a.get("value") or ""
                self._chosen = self._chosen or "selected" in a
        elif tag == "textarea" and name:
            self._textarea = name
            self.fields[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.fields[self._textarea] += data


class AdminClient:
    """A logged-in admin user over HTTP (cookies, CSRF token, redirects followed)."""

    def __init__(self, base: str, username: str, password: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        fields = self.fields("/admin/login/")
        url, _ = self.post("/admin/login/", {**fields, "username": username,
                                             "password": password, "next": "/admin/"})
        assert url.endswith("/admin/"), f"admin login failed: {url}"

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=scaled(30)) as reply:
            return reply.read().decode()

    def post(self, path: str, data: dict | list) -> tuple[str, str]:
        """POST a form; returns (the URL it ended at, the page there)."""
        body = urllib.parse.urlencode(data, doseq=True).encode()
        request = urllib.request.Request(self.base + path, data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Referer": self.base + path})
        with self.opener.open(request, timeout=scaled(30)) as reply:
            return reply.geturl(), reply.read().decode()

    def fields(self, path: str) -> dict[str, str]:
        parser = FormFields()
        parser.feed(self.get(path))
        return parser.fields

    def submit(self, page: str, **changes: str) -> tuple[str, str]:
        """Open the form at ``page``, change some fields, save."""
        return self.post(page, {**self.fields(page), **changes, "_save": "Save"})

    def topic_id(self, topic: str) -> int:
        # The list shows the path with <wbr> after its inner slashes (topics.display), no
        # character of its text.
        page = self.get(TOPICS + "?" + urllib.parse.urlencode({"q": topic})).replace("<wbr>", "")
        found = re.search(rf'href="{TOPICS}(\d+)/change/[^"]*">{re.escape(topic)}</a>', page)
        assert found, f"{topic} not in the admin's topic list"
        return int(found.group(1))


@dataclass
class Stack:
    http: str
    smqp: BrokerProcess

    def admin(self) -> AdminClient:
        return AdminClient(self.http, "root", "pw")

    def session(self, user: str = "root") -> Session:
        return Session(self.smqp.host, self.smqp.port, user)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("admin-services")
    with fresh_database("sqlite", base) as env:
        # The grant in the setup's process (a ``manage.py`` start costs ~2 s of CPU).
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("root", "bob") + SETUP
                   + "\nfrom django.core.management import call_command\n"
                     "call_command('grant', 'bob', '/gone', 'subscribe')\n")
        with listener(env, base, name="admin-smqp") as smqp, daphne(env, base) as url:
            yield Stack(url, smqp)


def errors_of(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S))


# ------------------------------------------------------------------------------------- tests


def test_a_rename_in_the_admin_moves_the_subtree_and_is_told(stack):
    admin = stack.admin()
    with stack.session() as root:
        assert root.command("SUB TOPIC /shop/a").code == 200
        url, page = admin.submit(f"{TOPICS}{admin.topic_id('/shop/a')}/change/", path="/shop/c")
        assert url.endswith(TOPICS), errors_of(page) or url
        note = root.notification(timeout=10)
        assert (note.topic, note.action, note.value) == ("/shop/a", "RENAME", "/shop/c"), note
        assert root.command("LIST TOPIC /shop/c").lines[1:] == ["/shop/c/deep"]
        assert root.command("LIST TOPIC /shop/a").code == 404
        assert root.command("SET TOPIC NAME /shop/c/deep /shop/c/deeper").code == 200
        root.command("UNSUB *")


def test_a_refused_change_is_a_form_error_and_changes_nothing(stack):
    admin = stack.admin()
    change = f"{TOPICS}{admin.topic_id('/shop/b')}/change/"
    url, page = admin.submit(change, path="/nowhere/b")  # no such parent: 404 over SMQP
    assert url.endswith(change) and "Refused, as over SMQP: 404" in errors_of(page), page
    url, page = admin.submit(change, path="/shop/Trash")
    assert url.endswith(change) and "Trash is a reserved topic name" in errors_of(page)
    url, page = admin.submit(change, path="/accounts/b")
    assert url.endswith(change) and "Refused, as over SMQP: 405" in errors_of(page)
    bob = admin.topic_id("/accounts/bob")
    request = urllib.request.Request(f"{stack.http}{TOPICS}{bob}/delete/")
    with pytest.raises(urllib.error.HTTPError) as refused:
        admin.opener.open(request, timeout=scaled(30))
    assert refused.value.code == 403  # an account topic goes with its account
    with stack.session() as root:
        assert root.command("COUNT TOPIC /shop/b").code == 200  # as it was


def test_topics_and_keywords_made_in_the_admin_are_told(stack):
    admin = stack.admin()
    with stack.session() as root:
        assert root.command("SUB TOPIC /shop/*").code == 200
        url, page = admin.submit(f"{TOPICS}add/", path="/shop/new", _continue="1",
                                 **{"keywords-0-keyword": "FRESH"})
        assert "/change/" in url, errors_of(page) or url
        note = root.notification(timeout=10)
        assert (note.topic, note.action) == ("/shop/new", "ADDED"), note
        # The listener's topic tree follows within a poll (SMQP_CACHE_POLL_SECONDS): asked
        # until it has, not after a fixed sleep.
        wait_until(lambda: root.command("FIND TOPIC /shop (FRESH)").lines[1:]
                   == ["/shop/new (FRESH)"], 5, message="FIND TOPIC to show /shop/new (FRESH)")
        url, page = admin.submit(url.removeprefix(stack.http),
                                 **{"keywords-0-keyword": "RIPE"})
        assert url.endswith(TOPICS), errors_of(page) or url
        note = root.notification(timeout=10)
        assert (note.topic, note.action, note.value) == ("/shop/new", "KEYWORDS", "RIPE"), note
        wait_until(lambda: root.command("GET TOPIC KEYWORDS /shop/new").lines[-1] == "RIPE",
                   5, message="GET TOPIC KEYWORDS to give RIPE")
        root.command("UNSUB *")


def test_a_delete_in_the_admin_keeps_the_topic_until_its_queue_empties(stack):
    with stack.session("bob") as bob:
        assert bob.command("SUB MESSAGE /gone").code == 200
    admin = stack.admin()
    gone = admin.topic_id("/gone")
    with stack.session() as root:
        assert root.command("SUB TOPIC /gone").code == 200
        smuid = smuid_of(root.publish("/gone", "G1"))
        confirm = admin.fields(f"{TOPICS}{gone}/delete/")
        url, page = admin.post(f"{TOPICS}{gone}/delete/", {**confirm, "post": "yes"})
        assert url.endswith(TOPICS), url
        assert root.command("CREATE TOPIC /gone").code == 409  # kept: its queue holds G1
        assert "is being removed" in page, page
        note = root.notification(timeout=10)
        assert (note.topic, note.action) == ("/gone", "DELETED"), note
        # The listener's topic tree follows within a poll: asked until it has.
        wait_until(lambda: "/gone" not in root.command("LIST TOPIC /").lines, 5,
                   message="LIST TOPIC to leave /gone out")
        root.command("UNSUB *")
    with stack.session("bob") as bob:
        delivered = bob.message(timeout=10)
        assert delivered.topic == "/gone" and delivered.message.get("Smuid").endswith(
            f"/{smuid}")
        bob.ack()
        bob.command("UNSUB *")
    # The ACK started G1's timeout (0 s here): the sweeps take it to Trash, then the topic.
    out = stack.smqp.manage("shell", "--no-imports", "-c", """
import time
from broker.services.sweeps import expire_messages
from broker.services.topics import finalize_removal
for _ in range(150):
    expire_messages()
    if finalize_removal():
        print("REMOVED")
        break
    time.sleep(0.1)
""").stdout
    assert "REMOVED" in out, out
    # No wait for the listener's topic tree: a login reads the shared topic generation now
    # (SMQP _begin_session), which the removal bumped on commit.
    with stack.session() as root:
        assert root.command("CREATE TOPIC /gone").code == 200


def test_the_admin_removes_a_state_message_into_trash(stack):
    admin = stack.admin()
    with stack.session() as root:
        state = smuid_of(root.publish("/state", "S1", [("Timeout", "-1")]))
        other = smuid_of(root.publish("/state", "S2", [("Timeout", "-1")]))
        fields = admin.fields("/admin/broker/message/")
        _, page = admin.post("/admin/broker/message/", {
            "csrfmiddlewaretoken": fields["csrfmiddlewaretoken"],
            "action": "remove_into_trash", "index": "0", "_selected_action": [state]})
        assert "1 message(s) moved into Trash." in page, page
        trash = root.command(f"GET MESSAGE /state/trash {state}")
        assert trash.code == 200 and trash.lines[-1] == "1 messages", trash
        assert root.command("LIST MESSAGE /state").lines[-1] == str(other)


def test_the_report_schedule_form_lists_the_broker_tasks(stack):
    """The nightly report's schedule (a django-celery-beat PeriodicTask) is edited in the
    admin: its task list is the broker's Celery tasks, which the web process loads for it (the
    other processes do not load Celery), and the schedule saves as it stands."""
    admin = stack.admin()
    changelist = "/admin/django_celery_beat/periodictask/"
    found = re.search(rf'href="{changelist}(\d+)/change/[^"]*">Nightly usage report',
                      admin.get(changelist))
    assert found, "the nightly report's schedule is not in the admin"
    page = f"{changelist}{found.group(1)}/change/"
    options = set(re.findall(r'<option value="([\w.]+)"', admin.get(page)))
    assert {"spark_jobs.nightly_usage_report", "broker.expire_messages",
            "api.purge_idempotency_keys"} <= options, options
    assert admin.fields(page)["task"] == "spark_jobs.nightly_usage_report"
    url, saved = admin.submit(page)
    assert url.endswith(changelist), errors_of(saved)
