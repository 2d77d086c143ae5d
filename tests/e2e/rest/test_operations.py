"""Issue 36, items 1 and 5, over real HTTP (Daphne) with the SMQP listener on the same
database, SQLite and PostgreSQL: the operators' tools (sessions with their counters and
closing one, a topic's consumers with backlog and lag, purge, peek, account change / delete
/ password reset, definitions export and import, the index), the model permissions they
need, and strict request bodies (unknown fields, ``delivery_mode`` at the top level, header
errors that name the header and the rule)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from tests.conftest import run_manage
from tests.support.api_stack import ApiStack, api_stack
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled
from tests.support.xmpp_session import XmppSession

pytestmark = pytest.mark.e2e

SETUP = """
from django.contrib.auth.models import Permission
from broker.services import topics as ts
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for p in ['/ops', '/ops/fan', '/ops/work', '/ops/peek', '/ops/purge', '/ops/v']:
    ts.create_topic(snap, p)
Topic.objects.filter(path='/ops/work').update(delivery_mode='queue', retry_timeout=300)
for name in ['bob', 'alice', 'dave']:
    UALEntry.objects.create(topic=Topic.objects.get(path='/ops'), principal_kind='account',
                            account=Account.objects.get(username=name), right='subscribe')
UALEntry.objects.create(topic=Topic.objects.get(path='/ops'), principal_kind='account',
                        account=Account.objects.get(username='alice'), right='publish')
for name in ['watcher', 'keeper']:
    Account.objects.filter(username=name).update(is_staff=True)
keeper = Account.objects.get(username='keeper')
keeper.user_permissions.set(Permission.objects.filter(codename__in=[
    'view_loginsession', 'change_loginsession', 'view_delivery', 'delete_message',
    'view_message', 'change_account', 'delete_account']))
from topics import tree
tree.changed()
"""

USERS = ("root", "bob", "alice", "watcher", "keeper", "carol", "dave")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    base = tmp_path_factory.mktemp(f"ops-{request.param}")
    # XMPP's PLAIN over the loopback: the XMPP session test logs in without TLS.
    extra = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_PBKDF2_ITERATIONS": "4096"}
    with api_stack(request.param, base, SETUP, users=USERS, extra_env=extra) as s:
        yield s


def sessions_of(client: httpx.Client, account: str) -> list[dict]:
    reply = client.get("sessions/", params={"account": account})
    assert reply.status_code == 200, reply.text
    return reply.json()["results"]


def wait_for(check, timeout: float = 15.0, step: float = 0.3):
    deadline = time.monotonic() + scaled(timeout)
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)


def test_the_index_lists_the_resources(stack):
    with stack.client("bob") as bob:
        reply = bob.get("")
        assert reply.status_code == 200, reply.text
        resources = reply.json()["resources"]
        for name in ("topics", "subscriptions", "accounts", "sessions", "definitions",
                     "stats", "links", "reports", "ual/entries"):
            assert name in resources
        assert resources["sessions"].endswith("/api/v1/sessions/")
        assert reply.json()["schema"].endswith("/api/schema/")
    assert httpx.get(stack.http + "/api/v1/").status_code == 401


def test_sessions_show_door_peer_counters_and_locks(stack):
    with stack.session("bob") as bob, stack.session("alice") as alice, \
            stack.client() as root:
        assert bob.command("SUB MESSAGE /ops/fan").code == 200
        assert bob.command("SUB MESSAGE /ops/work").code == 200
        for i in range(3):
            smuid_of(alice.publish("/ops/fan", f"fan-{i}"))
        smuid_of(alice.publish("/ops/work", "work-1"))
        got = []
        for _ in range(2):  # two ACKed; the next ones stay unACKed (one in flight)
            got.append(bob.message())
            bob.ack()
        bob.message()  # sent, not ACKed

        def counted():
            rows = sessions_of(root, "bob")
            return rows if rows and rows[0]["messages_out"] >= 3 and \
                rows[0]["unacked"] >= 1 else None

        [row] = wait_for(counted)
        assert row["door"] == "smqp"
        assert row["account"] == "bob"
        assert row["peer"].startswith("127.0.0.1")
        assert row["auth_method"] == "CLEAR/1.0"
        assert row["messages_out"] == 3
        assert row["messages_in"] == 0
        assert row["unacked"] == 1
        assert row["rate_out"] > 0
        assert row["counters_unavailable"] is None
        [pub] = wait_for(lambda: [r for r in sessions_of(root, "alice")
                                  if r["messages_in"] >= 4])
        assert pub["messages_in"] == 4
        assert pub["rate_in"] > 0
        one = root.get(f"sessions/{row['guid']}")
        assert one.status_code == 200 and one.json()["guid"] == row["guid"]
        # (A queue lock counted as "locked": test_a_queue_lock_is_counted_as_locked...)


def test_a_queue_lock_is_counted_as_locked_and_the_login_time_is_given(stack):
    """A queue-mode message sent and not ACKed is a lock in the store: the session's
    ``locked`` and ``unacked`` say 1, and 0 again once it is ACKed."""
    before = time.time()
    with stack.session("dave") as dave, stack.client() as root:
        assert dave.command("SUB MESSAGE /ops/work").code == 200
        with stack.session("alice") as alice:
            smuid = smuid_of(alice.publish("/ops/work", "work-locked"))
        got = dave.message()
        assert got.message.get("Smuid").endswith(f"/{smuid}")
        [row] = wait_for(lambda: [r for r in sessions_of(root, "dave")
                                  if r["unacked"] == 1])
        assert row["locked"] == 1
        assert row["messages_out"] == 1
        started = datetime.fromisoformat(row["started"]).timestamp()
        assert before - 5 <= started <= time.time() + 5
        dave.ack()
        [row] = wait_for(lambda: [r for r in sessions_of(root, "dave")
                                  if r["unacked"] == 0 and r["locked"] == 0])
        assert row["messages_out"] == 1


def test_an_xmpp_session_is_listed_with_its_door_and_closed(stack):
    xmpp = XmppSession(stack.http.replace("http://", "ws://", 1) + "/xmpp-websocket")
    try:
        xmpp.login("alice")
        reply = xmpp.pubsub("set", "<publish node='/ops/fan'><item id='x1'>"
                                   "<p xmlns='urn:t'/></item></publish>")
        assert reply.get("type") == "result"
        with stack.client() as root:
            [row] = wait_for(lambda: [r for r in sessions_of(root, "alice")
                                      if r["door"] == "xmpp" and r["messages_in"] == 1])
            assert row["peer"].startswith("127.0.0.1")
            assert row["auth_method"].lower().startswith("xmpp:")
            doors = root.get("sessions/", params={"door": "xmpp"}).json()["results"]
            assert [r["guid"] for r in doors] == [row["guid"]]
            assert root.delete(f"sessions/{row['guid']}").status_code == 202
            assert xmpp.closed()
            assert wait_for(lambda: not [r for r in sessions_of(root, "alice")
                                         if r["door"] == "xmpp"])
    finally:
        xmpp.close()


def test_closing_a_session_disconnects_it_and_is_audited(stack):
    with stack.session("carol") as carol, stack.client() as root:
        [row] = sessions_of(root, "carol")
        reply = root.delete(f"sessions/{row['guid']}")
        assert reply.status_code == 202, reply.text
        with pytest.raises((ConnectionError, OSError)):
            for _ in range(10):
                carol.notification(timeout=10)
        assert wait_for(lambda: not sessions_of(root, "carol"))
        assert root.delete(f"sessions/{row['guid']}").status_code == 404
    log = run_manage(stack.env, "shell", "-c",
                     "from django.contrib.admin.models import LogEntry;"
                     "print([e.change_message for e in LogEntry.objects.all()])").stdout
    assert f"Closed session {row['guid']}." in log


def test_consumers_show_backlog_and_lag(stack):
    with stack.session("alice") as alice, stack.client() as root:
        assert alice.command("SUB MESSAGE /ops/v").code == 200
    with stack.session("root") as pub:
        for i in range(3):
            smuid_of(pub.publish("/ops/v", f"v-{i}"))
    time.sleep(1.1)
    with stack.client() as root:
        reply = root.get("queues/ops/v/consumers")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["topic"] == "/ops/v"
        assert body["messages"] == 3
        assert body["oldest_seconds"] >= 1
        [consumer] = [c for c in body["consumers"] if c["account"] == "alice"]
        assert consumer["backlog"] == 3
        assert consumer["lag_seconds"] >= 1
        assert consumer["subscriptions"][0]["pattern"] == "/ops/v"
        assert consumer["sessions"] == []  # alice logged out
        assert root.get("queues/ops/nothing/consumers").status_code == 404


def test_peek_is_read_only_and_purge_counts_and_audits(stack):
    with stack.session("alice") as alice:
        assert alice.command("SUB MESSAGE /ops/purge").code == 200
    with stack.session("root") as pub:
        smuids = [smuid_of(pub.publish("/ops/purge", f"p-{i}", [("Name", f"n{i}")]))
                  for i in range(4)]
    with stack.client() as root:
        for _ in range(2):  # twice: the first peek changed nothing
            reply = root.get("queues/ops/purge/peek", params={"count": 2})
            assert reply.status_code == 200, reply.text
            peeked = reply.json()["messages"]
            assert [m["smuid"] for m in peeked] == smuids[:2]
            assert peeked[0]["sections"][0]["text"] == "p-0"
            assert peeked[0]["headers"]["Name"] == "n0"
            assert peeked[0]["deliveries"] == {"pending": 1}
        after = root.get("queues/ops/purge/peek", params={"after": smuids[2]}).json()
        assert [m["smuid"] for m in after["messages"]] == smuids[3:]
        reply = root.post("queues/ops/purge/purge")
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"topic": "/ops/purge", "purged": 4}
        assert root.get("queues/ops/purge/peek").json()["messages"] == []
        trash = root.get("queues/ops/purge/peek", params={"state": "trash"}).json()
        assert [m["smuid"] for m in trash["messages"]] == smuids
        assert trash["messages"][0]["deliveries"] == {"dead": 1}
        consumers = root.get("queues/ops/purge/consumers").json()
        assert consumers["messages"] == 0
        assert root.post("queues/ops/purge/purge").json()["purged"] == 0
    with stack.session("alice") as alice:  # nothing purged comes to its subscriber
        topics = []
        while not alice.quiet(1.5):
            note = alice.notification()
            topics.append(getattr(note, "topic", None))
            if hasattr(note, "message"):
                alice.ack()
        assert "/ops/purge" not in topics
    log = run_manage(stack.env, "shell", "-c",
                     "from django.contrib.admin.models import LogEntry;"
                     "from broker.models import UsageEvent;"
                     "print([e.change_message for e in LogEntry.objects.all()]);"
                     "print(UsageEvent.objects.filter(kind='topic', topic='/ops/purge')"
                     ".values_list('detail', 'account').first())").stdout
    assert "Purged 4 pending message(s) from /ops/purge." in log
    # (PostgreSQL's jsonb orders the keys its own way.)
    assert "'reason': 'purge'" in log and "'count': 4" in log and "'root')" in log


def test_model_permissions_decide(stack):
    watcher = httpx.Client(base_url=stack.http + "/api/v1/", timeout=scaled(30), headers={
        "Authorization": f"Bearer {stack.tokens['watcher']}"})
    keeper = httpx.Client(base_url=stack.http + "/api/v1/", timeout=scaled(30), headers={
        "Authorization": f"Bearer {stack.tokens['keeper']}"})
    with watcher, keeper, stack.client("bob") as bob:
        # Staff without the model permission: 403; a plain account: 403 as well.
        for client in (watcher, bob):
            assert client.get("sessions/").status_code == 403
            assert client.post("queues/ops/peek/purge").status_code == 403
            assert client.get("queues/ops/peek/peek").status_code == 403
            assert client.get("definitions").status_code == 403
            assert client.patch("accounts/carol", json={"proper_name": "x"}).status_code == 403
        assert keeper.get("sessions/").status_code == 200
        assert keeper.get("queues/ops/peek/peek").status_code == 200
        assert keeper.get("queues/ops/peek/consumers").status_code == 200
        assert keeper.patch("accounts/carol", json={"phone": "+1 555"}).status_code == 200
        # Definitions are a superuser's: an import may create superusers.
        assert keeper.get("definitions").status_code == 403
        assert keeper.post("accounts/", json={"username": "zed", "password": "pw"}) \
            .status_code == 403


def test_account_change_reset_and_delete(stack):
    with stack.client() as root:
        reply = root.patch("accounts/alice", json={"proper_name": "Alice A.",
                                                   "email": "alice@example.org"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["proper_name"] == "Alice A."
        assert root.get("accounts/alice").json()["email"] == "alice@example.org"
        bad = root.patch("accounts/alice", json={"email": "not an address"})
        assert bad.status_code == 400
        assert "email" in bad.json()["errors"]
        # One's own account cannot be deactivated, demoted or deleted from under oneself.
        assert root.patch("accounts/root", json={"is_active": False}).status_code == 409
        assert root.delete("accounts/root").status_code == 409
        # Password reset: the new one logs in over SMQP, the old one not any more.
        assert root.post("accounts/alice/password",
                         json={"password": "n3w-Secret-pw"}).status_code == 204
        with Session(stack.smqp.host, stack.smqp.port) as s:
            assert s.command("LOGIN alice CLEAR/1.0").code == 200
            assert s.command("PASS alice pw").code != 200
        with Session(stack.smqp.host, stack.smqp.port, "alice", "n3w-Secret-pw"):
            pass
        assert root.post("accounts/alice/password", json={"password": "n3w-Secret-pw"}) \
            .status_code == 204
        assert root.post("accounts/alice/password", json={}).status_code == 400
        # Deactivating closes the live sessions; deleting removes the account.
        assert root.post("accounts/", json={"username": "temp", "password": "Temp-pw-1234"}
                         ).status_code == 201
        with Session(stack.smqp.host, stack.smqp.port, "temp", "Temp-pw-1234") as temp:
            assert wait_for(lambda: sessions_of(root, "temp"))
            assert root.patch("accounts/temp", json={"is_active": False}).status_code == 200
            with pytest.raises((ConnectionError, OSError)):
                for _ in range(10):
                    temp.notification(timeout=10)
        assert root.delete("accounts/temp").status_code == 204
        assert root.get("accounts/temp").status_code == 404
        assert root.delete("accounts/temp").status_code == 404


def test_definitions_round_trip_and_import_is_idempotent(stack, tmp_path):
    with stack.client() as root:
        assert root.post("topics/", json={
            "path": "/defs", "keywords": ["alpha", "beta"],
            "parameters": {"delivery_mode": "queue", "max_retries": 4}}).status_code == 201
        assert root.post("topics/", json={"path": "/defs/alias", "link": "/ops/fan"}) \
            .status_code == 201
        assert root.post("ual/entries/", json={
            "topic": "/defs", "principal_kind": "account", "account": "bob",
            "right": "publish"}).status_code == 201
        assert root.post("links/", json={"name": "peer", "host": "peer.example",
                                         "account": "there", "password": "secret",
                                         "imports": ["/news/*"]}).status_code == 201
        doc = root.get("definitions").json()
        assert doc["smqp_definitions"] == 1
        [defs] = [t for t in doc["topics"] if t["path"] == "/defs"]
        assert defs["delivery_mode"] == "queue"
        assert defs["parameters"] == {"max_retries": 4}
        assert defs["keywords"] == ["alpha", "beta"]
        [alias] = [t for t in doc["topics"] if t["path"] == "/defs/alias"]
        assert alias["link"] == "/ops/fan"
        assert any(e == {"topic": "/defs", "principal_kind": "account", "account": "bob",
                         "group": None, "right": "publish", "effect": "allow"}
                   for e in doc["ual_entries"])
        [bob] = [a for a in doc["accounts"] if a["username"] == "bob"]
        assert "password" not in bob
        [peer] = [link for link in doc["links"] if link["name"] == "peer"]
        assert "password" not in peer and peer["imports"] == ["/news/*"]
        assert not any(t["path"].startswith("/accounts/") for t in doc["topics"])
        # The same document again: nothing created or changed.
        again = root.post("definitions", json=doc)
        assert again.status_code == 200, again.text
        assert all(v["created"] == 0 and v["changed"] == 0 for v in again.json().values())
    # Into a fresh broker: everything comes back; a second import changes nothing.
    with api_stack("sqlite", tmp_path, "", users=("root",)) as fresh, \
            fresh.client() as root2:
        first = root2.post("definitions", json=doc)
        assert first.status_code == 200, first.text
        counts = first.json()
        # (/accounts, the account topics' parent, is there already.)
        assert counts["topics"]["created"] == len(doc["topics"]) - 1
        assert counts["accounts"]["created"] == len(doc["accounts"]) - 1  # root was there
        assert counts["ual_entries"]["created"] == len(doc["ual_entries"])
        assert counts["links"]["created"] == 1
        second = root2.post("definitions", json=doc).json()
        assert all(v["created"] == 0 and v["changed"] == 0 for v in second.values())
        exported = root2.get("definitions").json()
        for key in ("topics", "ual_entries", "links", "groups"):
            assert exported[key] == doc[key], key
        # An imported account has no usable password until one is set.
        with Session(fresh.smqp.host, fresh.smqp.port) as s:
            assert s.command("LOGIN bob CLEAR/1.0").code == 200
            assert s.command("PASS bob pw").code != 200
        # A refusal names the item and changes nothing.
        bad = root2.post("definitions", json={"smqp_definitions": 1, "topics": [
            {"path": "/new1"}, {"path": "/new2", "link": "/missing"}]})
        assert bad.status_code == 404, bad.text
        assert "/new2" in bad.json()["detail"]
        assert root2.get("topics/new1").status_code == 404


def test_unknown_fields_are_refused_by_name(stack):
    with stack.client() as root:
        reply = root.post("topics/", json={"path": "/strict", "bogus": 1})
        assert reply.status_code == 400
        assert reply.json()["errors"] == {"bogus": ["Unknown field."]}
        assert root.get("topics/strict").status_code == 404
        nested = root.post("topics/", json={"path": "/strict",
                                            "parameters": {"max_retries": 1, "retries": 2}})
        assert nested.status_code == 400
        assert nested.json()["errors"] == {"parameters": {"retries": ["Unknown field."]}}
        sub = root.post("subscriptions/", json={"pattern": "/ops/fan",
                                                "selector": {"class": "JMS", "text": "a=1",
                                                             "x": 1}})
        assert sub.status_code == 400 and "x" in sub.json()["errors"]["selector"]
        entry = root.post("ual/entries/", json={"id": 5, "topic": "/ops", "right": "read",
                                                "principal_kind": "everyone"})
        assert entry.status_code == 400 and entry.json()["errors"] == {
            "id": ["Unknown field."]}


def test_delivery_mode_at_the_top_level_is_honoured_or_refused(stack):
    with stack.client() as root:
        made = root.post("topics/", json={"path": "/top", "delivery_mode": "queue"})
        assert made.status_code == 201, made.text
        assert made.json()["delivery_mode"] == "queue"
        assert root.get("topics/top").json()["delivery_mode"] == "queue"
        changed = root.patch("topics/top", json={"delivery_mode": "fanout"})
        assert changed.status_code == 200 and changed.json()["delivery_mode"] == "fanout"
        both = root.post("topics/", json={"path": "/top2", "delivery_mode": "queue",
                                          "parameters": {"delivery_mode": "fanout"}})
        assert both.status_code == 400
        assert "delivery_mode" in both.json()["errors"]
        assert root.get("topics/top2").status_code == 404


def test_header_errors_name_the_header_and_the_rule(stack):
    with stack.client() as root:
        reply = root.post("topics/ops/fan/messages", json={
            "headers": {"Priority": "0", "Timeout": "soon"}, "sections": [{"text": "x"}]})
        assert reply.status_code == 400
        errors = reply.json()["errors"]["headers"]
        assert errors["Priority"] == [
            "Invalid number: a whole number from 1 (1 is the highest priority)."]
        assert errors["Timeout"][0].startswith("Invalid timeout: HH:MM:SS")
    # Over SMQP the reply names the header too.
    with stack.session() as s:
        reply = s.publish("/ops/fan", "p0", [("Priority", "0")])
        assert reply.code == 400
        assert "Priority" in " ".join(reply.lines)
