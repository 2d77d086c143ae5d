"""Issue 36, item 2: ``smqp admin`` as a subprocess against a real broker (Daphne for the
REST API, the SMQP listener): sessions list and close, consumers, peek, purge, definitions
export and import, accounts, grants; tables and --json; exit statuses (1 refused, 2 usage,
3 no connection, 4 not authenticated), with a token or with the account's password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT, query_database
from tests.support.api_stack import ApiStack, api_stack
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SETUP = """
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for p in ['/jobs', '/jobs/in']:
    ts.create_topic(snap, p)
from topics.models import Topic
from ual.models import UALEntry
UALEntry.objects.create(topic=Topic.objects.get(path='/jobs'), principal_kind='account',
                        account=Account.objects.get(username='bob'), right='subscribe')
from topics import tree
tree.changed()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    with api_stack(request.param, tmp_path_factory.mktemp(f"admin-{request.param}"),
                   SETUP) as s:
        yield s


def admin(stack: ApiStack, *args: str, token: str | None = "root", password: str | None = None,
          account: str = "root", stdin: str | None = None,
          new_password: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}
    env.update(SMQP_API_URL=stack.http, SMQP_ACCOUNT=account, PYTHONUNBUFFERED="1")
    if new_password is not None:
        env["SMQP_NEW_PASSWORD"] = new_password
    if token is not None:
        env["SMQP_API_TOKEN"] = stack.tokens.get(token, token)
    if password is not None:
        env["SMQP_PASSWORD"] = password
    return subprocess.run([sys.executable, "-m", "broker.cli", "admin", *args], env=env,
                          cwd=ROOT, input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=scaled(60))


def test_sessions_are_listed_as_a_table_and_json_and_closed(stack):
    with stack.session("bob") as bob:
        assert bob.command("SUB MESSAGE /jobs/in").code == 200
        listed = admin(stack, "sessions", "list")
        assert listed.returncode == 0, listed.stderr
        header = listed.stdout.splitlines()[0].split()
        assert header[:4] == ["guid", "door", "account", "client"]
        assert {"in", "out", "unacked", "locked", "in/s", "out/s"} <= set(header)
        [row] = [line for line in listed.stdout.splitlines()[1:] if " bob " in line]
        assert " smqp " in row and "127.0.0.1" in row
        rows = json.loads(admin(stack, "sessions", "list", "--json", "--account", "bob")
                          .stdout)
        [session] = rows
        assert session["account"] == "bob" and session["door"] == "smqp"
        closed = admin(stack, "sessions", "close", session["guid"])
        assert closed.returncode == 0, closed.stderr
        assert f"session {session['guid']} is being closed" in closed.stdout
        with pytest.raises((ConnectionError, OSError)):
            for _ in range(10):
                bob.notification(timeout=10)
    again = admin(stack, "sessions", "close", session["guid"])
    assert again.returncode == 1
    assert again.stderr.startswith("smqp: error: 404 ")


def test_consumers_peek_and_purge(stack):
    with stack.session("bob") as bob:
        assert bob.command("SUB MESSAGE /jobs").code == 200
    with stack.session() as root:
        smuids = [smuid_of(root.publish("/jobs", f"job-{i}", sections=[
            ("text/plain", f"job {i}\nsecond line".encode())])) for i in range(3)]
    consumers = admin(stack, "consumers", "/jobs")
    assert consumers.returncode == 0, consumers.stderr
    assert "/jobs (fanout): 3 pending" in consumers.stdout
    header = consumers.stdout.splitlines()[1].split()
    assert header == ["account", "subscriptions", "sessions", "backlog", "locked", "dead",
                      "lag", "s"]
    [line] = [x for x in consumers.stdout.splitlines() if x.startswith("bob ")]
    # account, subscriptions, (no live session: an empty cell), backlog, locked, dead, lag
    assert line.split()[:5] == ["bob", "/jobs", "3", "0", "0"]
    peek = admin(stack, "peek", "/jobs", "-n", "2")
    assert peek.returncode == 0, peek.stderr
    assert f"smuid {smuids[0]}" in peek.stdout and "job 0" in peek.stdout
    assert f"smuid {smuids[2]}" not in peek.stdout
    peeked = json.loads(admin(stack, "peek", "/jobs", "--json").stdout)
    assert [m["smuid"] for m in peeked] == smuids
    purge = admin(stack, "purge", "/jobs", "--yes")
    assert purge.returncode == 0, purge.stderr
    assert purge.stdout.strip() == "purged 3 message(s) from /jobs"
    assert json.loads(admin(stack, "purge", "/jobs", "--yes", "--json").stdout)["purged"] == 0
    missing = admin(stack, "purge", "/nope", "--yes")
    assert missing.returncode == 1 and "404" in missing.stderr


def test_export_and_import_definitions(stack, tmp_path):
    target = tmp_path / "defs.json"
    exported = admin(stack, "export", str(target))
    assert exported.returncode == 0, exported.stderr
    doc = json.loads(target.read_text())
    assert any(t["path"] == "/jobs/in" for t in doc["topics"])
    imported = admin(stack, "import", str(target))
    assert imported.returncode == 0, imported.stderr
    lines = imported.stdout.splitlines()
    assert lines[0].split() == ["what", "created", "changed", "unchanged"]
    for line in lines[1:]:
        assert line.split()[1:3] == ["0", "0"], line
    doc["topics"].append({"path": "/jobs/new", "keywords": ["made by import"]})
    imported = admin(stack, "import", "-", "--json", stdin=json.dumps(doc))
    assert json.loads(imported.stdout)["topics"]["created"] == 1
    bad = admin(stack, "import", "-", stdin="{not json")
    assert bad.returncode == 2 and "cannot read -" in bad.stderr


def test_accounts_and_grants(stack):
    made = admin(stack, "accounts", "add", "dora", "--email", "dora@example.org",
                 new_password="Dora-pw-9876")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "account dora created"
    listed = admin(stack, "accounts", "list")
    assert any(line.split()[0] == "dora" for line in listed.stdout.splitlines()[1:])
    changed = admin(stack, "accounts", "set", "dora", "--proper-name", "Dora D", "--json")
    assert json.loads(changed.stdout)["proper_name"] == "Dora D"
    assert admin(stack, "accounts", "set", "dora").returncode == 2
    grant = admin(stack, "grants", "add", "/jobs", "subscribe", "--account", "dora", "--json")
    assert grant.returncode == 0, grant.stderr
    entry = json.loads(grant.stdout)
    assert entry["account"] == "dora" and entry["right"] == "subscribe"
    grants = admin(stack, "grants", "list", "--account", "dora")
    assert f"{entry['id']}" in grants.stdout and "/jobs" in grants.stdout
    # The account works over SMQP with its password, and the grant with it (no wait: the
    # login reads the UAL generation the committed grant bumped).
    with Session(stack.smqp.host, stack.smqp.port, "dora", "Dora-pw-9876") as dora:
        assert dora.command("SUB MESSAGE /jobs").code == 200
    # A password reset: the new one logs in, the old one no more.
    reset = admin(stack, "accounts", "passwd", "dora", new_password="Dora-new-5432")
    assert reset.returncode == 0, reset.stderr
    with Session(stack.smqp.host, stack.smqp.port) as s:
        assert s.command("LOGIN dora CLEAR/1.0").code == 200
        assert s.command("PASS dora Dora-pw-9876").code != 200
    with Session(stack.smqp.host, stack.smqp.port, "dora", "Dora-new-5432"):
        pass
    assert admin(stack, "grants", "delete", str(entry["id"])).returncode == 0
    assert admin(stack, "accounts", "delete", "dora").returncode == 0
    gone = admin(stack, "accounts", "show", "dora")
    assert gone.returncode == 1 and "404" in gone.stderr


def test_password_login_exit_statuses_and_permissions(stack):
    # The account's password instead of a token: a token for the run, revoked at the end.
    ok = admin(stack, "sessions", "list", "--json", token=None, password="pw")
    assert ok.returncode == 0, ok.stderr
    wrong = admin(stack, "sessions", "list", token=None, password="nope")
    assert wrong.returncode == 4 and wrong.stderr.startswith("smqp: error: 401 ")
    assert admin(stack, "sessions", "list", token="smqp_bogus").returncode == 4
    refused = admin(stack, "sessions", "list", token="bob")
    assert refused.returncode == 1 and "403" in refused.stderr
    usage = admin(stack, "sessions", "frobnicate")
    assert usage.returncode == 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}
    down = subprocess.run([sys.executable, "-m", "broker.cli", "admin", "--url",
                           "http://127.0.0.1:9", "--token", "x", "overview"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(60))
    assert down.returncode == 3 and "cannot reach" in down.stderr
    overview = admin(stack, "overview")
    assert overview.returncode == 0 and overview.stdout.startswith("sessions: ")
    # No token left behind by the password login: only the fixture's one per account.
    # Read from the database itself (no ``manage.py shell`` start).
    [(left,)] = query_database(
        stack.env, "SELECT COUNT(*) FROM api_apitoken WHERE name = %s AND revoked IS NULL",
        ("smqp admin",))
    assert left == 0
