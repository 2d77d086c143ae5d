"""Issue 3 over real sockets: every topic, account and session command, with the draft's
section 4 examples replayed and every reply code exercised, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import socket
import time
import uuid

import pytest

from accounts.scram import ScramClient
from tests.conftest import fresh_listener, manage_many
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


def text(reply: list[bytes]) -> list[str]:
    return [line.decode().rstrip("\r\n") for line in reply]


def client(broker, user: str = "root", password: str = "pw") -> RawClient:
    c = RawClient(broker.host, broker.port)
    c.login(user, password)
    return c


def cmd(c: RawClient, line: str) -> list[str]:
    """Send one command; skip notification blocks; return the reply lines."""
    c.send_line(line)
    return read_reply(c)


def pub(name: str, topic: str) -> bytes:
    """A one-byte text PUB MESSAGE."""
    return (f"PUB MESSAGE {topic} {name}\r\n\r\nContent-Type: text/plain\r\n"
            "Content-Length: 1\r\n\r\nx\r\n.\r\n").encode()


def read_reply(c: RawClient) -> list[str]:
    while True:
        first = c.read_line()
        if first.startswith(b"NOTIFY "):
            while c.read_line() not in (b"\r\n", b""):
                pass
            continue
        if first[3:4] == b" ":
            return text([first])
        return text([first, *c.read_reply()])


def read_notification(c: RawClient, timeout: float = 10.0) -> list[str]:
    """The next NOTIFY block (without its closing empty line)."""
    c.sock.settimeout(scaled(timeout))
    try:
        first = c.read_line()
        assert first.startswith(b"NOTIFY "), first
        block = [first]
        while (line := c.read_line()) not in (b"\r\n", b""):
            block.append(line)
        return text(block)
    finally:
        c.sock.settimeout(scaled(10.0))


def nothing_pending(c: RawClient, wait: float = 0.5) -> bool:
    c.sock.settimeout(scaled(wait))
    try:
        data = c.buf or c.sock.recv(65536)
    except TimeoutError:
        data = b""
    finally:
        c.sock.settimeout(scaled(10.0))
    return data == b""


@pytest.fixture(scope="module")
def tree(fresh_broker):
    """The draft's example tree, created by the superuser."""
    with client(fresh_broker) as c:
        for line in [
            "CREATE TOPIC /stocks (STOCKS,TICKERS)",
            "CREATE TOPIC /stocks/quotes",
            "CREATE TOPIC /stocks/quotes/ibm",
            "CREATE TOPIC /stocks/quotes/msft",
            "CREATE TOPIC /stocks/quotes/sony",
            "CREATE TOPIC /stocks/ibm (IBM,STOCKS,BIG BLUE,COMPUTERS)",
            "CREATE TOPIC /stocks/floral (FLOWERS,BLUE CARNATIONS)",
            "CREATE TOPIC /info",
            "CREATE TOPIC /info/news",
            "CREATE TOPIC /info/news/cnn",
            "CREATE TOPIC /weather",
            "CREATE TOPIC /news > /info/news/cnn",
            "CREATE TOPIC /news2",
            "CREATE TOPIC /news2/us",
            "CREATE TOPIC /news2/europe",
        ]:
            assert cmd(c, line) == ["200 OK"], line
    return fresh_broker


# --- the draft's section 4 examples -----------------------------------------------------------


def test_count_topic(tree):
    with client(tree) as c:
        assert cmd(c, "COUNT TOPIC /news2") == ["200-OK", "200 2"]
        assert cmd(c, "COUNT TOPIC /stocks") == ["200-OK", "200 3"]
        assert cmd(c, "COUNT TOPIC /stocks/*") == ["200-OK", "200 6"]
        assert cmd(c, "count topics /STOCKS/QUOTES") == ["200-OK", "200 3"]
        assert cmd(c, "COUNT TOPIC /nothere")[0].startswith("404 ")
        assert cmd(c, "COUNT TOPIC")[0].startswith("400 ")


def test_count_message_and_subscribers(tree):
    with client(tree) as c:
        assert cmd(c, "COUNT MESSAGE /stocks/quotes/ibm") == ["200-OK", "200 0"]
        assert cmd(c, "COUNT MESS /stocks/*") == ["200-OK", "200 0"]
        assert cmd(c, "COUNT SUB /stocks/quotes/ibm") == ["200-OK", "200 0"]
        with client(tree, "alice") as alice:
            assert cmd(alice, "SUB MESSAGE /accounts/alice")[0] == "200-OK"
        cmd(c, "SUB MESSAGE /stocks/quotes/*")
        assert cmd(c, "COUNT SUB /stocks/quotes/ibm") == ["200-OK", "200 1"]
        assert cmd(c, "COUNT SUBSCRIBERS /stocks/*") == ["200-OK", "200 1"]
        cmd(c, "UNSUB MESSAGE /stocks/quotes/*")
        assert cmd(c, "COUNT SUB /stocks/quotes/ibm") == ["200-OK", "200 0"]


def test_list_topic_root_with_virtual_topic(tree):
    with client(tree) as c:
        reply = cmd(c, "LIST TOPIC /")
    assert reply[0] == "200-OK"
    assert reply[-1].startswith("200 ") and all(r.startswith("200-") for r in reply[:-1])
    listed = [r[4:] for r in reply[1:]]
    for expected in ["/stocks", "/info", "/weather", "/news > /info/news/cnn"]:
        assert expected in listed


def test_list_topic_children_and_empty(tree):
    with client(tree) as c:
        assert cmd(c, "LIST TOPIC /news2") == ["200-OK", "200-/news2/europe", "200 /news2/us"]
        assert cmd(c, "LIST TOPIC /weather") == ["200-OK", "200 0 topics"]
        assert cmd(c, "LIST TOPIC /nope")[0].startswith("404 ")


def test_list_messages_empty(tree):
    with client(tree) as c:
        assert cmd(c, "LIST MESSAGES /stocks/quotes/ibm") == ["200-OK", "200 none"]
        assert cmd(c, "LIST MESSAGE /stocks/quotes/ibm/Trash") == ["200-OK", "200 none"]
        assert cmd(c, "LIST MESSAGE /nope")[0].startswith("404 ")


def test_create_topic_reply_codes(tree):
    with client(tree) as c:
        assert cmd(c, "CREATE TOPIC /cr") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /CR")[0].startswith("409 ")  # case-insensitive: exists
        assert cmd(c, "CREATE TOPIC /cr/a/b")[0].startswith("404 ")  # parent missing
        assert cmd(c, "CREATE TOPIC /cr/v > /cr/none")[0].startswith("404 ")  # target missing
        assert cmd(c, "CREATE TOPIC /cr/v > /news")[0].startswith("405 ")  # target is virtual
        assert cmd(c, "CREATE TOPIC /cr/v > /cr/v")[0].startswith("409 ")  # topic == target
        assert cmd(c, "CREATE TOPIC /accounts/zed")[0].startswith("405 ")
        assert cmd(c, "CREATE TOPIC /cr/Trash")[0].startswith("405 ")
        assert cmd(c, "CREATE TOPIC /cr/TRASH/x")[0].startswith("405 ")
        assert cmd(c, "CREATE TOPIC cr")[0].startswith("400 ")
        assert cmd(c, "CREATE TOPIC /cr/9x")[0].startswith("400 ")
        assert cmd(c, "CREATE TOPIC /cr/k (A/B)")[0].startswith("400 ")
        assert cmd(c, "CREATE TOPIC /cr/ibm (BIG BLUE) > /stocks/quotes/ibm") == ["200 OK"]
        assert cmd(c, "LIST TOPIC /cr") == ["200-OK", "200 /cr/ibm > /stocks/quotes/ibm"]
        assert cmd(c, "GET TOPIC KEYWORDS /cr/ibm") == ["200-OK", "200 BIG BLUE"]
    with client(tree, "bob") as bob:
        assert cmd(bob, "CREATE TOPIC /bobs")[0].startswith("401 ")


def test_get_topic_keywords_and_find(tree):
    with client(tree) as c:
        assert cmd(c, "GET TOPIC KEYWORDS /stocks/ibm") == [
            "200-OK", "200 IBM,STOCKS,BIG BLUE,COMPUTERS"]
        assert cmd(c, "GET TOPIC KEY /stocks/ibm")[1] == "200 IBM,STOCKS,BIG BLUE,COMPUTERS"
        assert cmd(c, "FIND TOPIC /stocks") == ["200-OK", "200 /stocks (STOCKS,TICKERS)"]
        assert cmd(c, "FIND TOPIC /stocks/ibm (BLUE)") == [
            "200-OK", "200 /stocks/ibm (IBM,STOCKS,BIG BLUE,COMPUTERS)"]
        assert cmd(c, "FIND TOPICS /stocks/* (BLUE)") == [
            "200-OK",
            "200-/stocks/floral (FLOWERS,BLUE CARNATIONS)",
            "200 /stocks/ibm (IBM,STOCKS,BIG BLUE,COMPUTERS)",
        ]
        assert cmd(c, "FIND TOPIC /stocks/* (blue,flow)") == [
            "200-OK", "200 /stocks/floral (FLOWERS,BLUE CARNATIONS)"]
        assert cmd(c, "FIND TOPIC /stocks/* (NOSUCH)") == ["200-OK", "200 0 topics"]
        assert cmd(c, "FIND TOPIC /nothere")[0].startswith("404 ")


def test_set_topic_keyword(tree):
    with client(tree) as c:
        assert cmd(c, "SET TOPIC KEYWORD /weather (RAIN,SUN)") == ["200 OK"]
        assert cmd(c, "GET TOPIC KEYWORDS /weather") == ["200-OK", "200 RAIN,SUN"]
        assert cmd(c, "SET TOPIC KEYWORDS /weather (SNOW)") == ["200 OK"]
        assert cmd(c, "GET TOPIC KEYWORDS /weather") == ["200-OK", "200 SNOW"]
        assert cmd(c, "SET TOPIC KEYWORD /nope (X)")[0].startswith("404 ")
        assert cmd(c, "SET TOPIC KEYWORD /weather X")[0].startswith("400 ")
    with client(tree, "bob") as bob:
        assert cmd(bob, "SET TOPIC KEYWORD /weather (X)")[0].startswith("404 ")  # not visible


def test_set_topic_name_reply_codes(tree):
    with client(tree) as c:
        assert cmd(c, "CREATE TOPIC /ren") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /ren/a") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /ren/a/deep") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /ren/taken") == ["200 OK"]
        assert cmd(c, "SET TOPIC NAME /ren/a /ren/a")[0].startswith("409 ")
        assert cmd(c, "SET TOPIC NAME /ren/a /REN/A")[0].startswith("409 ")
        assert cmd(c, "SET TOPIC NAME /ren/a /ren/taken")[0].startswith("409 ")
        assert cmd(c, "SET TOPIC NAME /ren/none /ren/b")[0].startswith("404 ")
        assert cmd(c, "SET TOPIC NAME /ren/a /nowhere/b")[0].startswith("404 ")
        assert cmd(c, "SET TOPIC NAME /accounts/bob /ren/bob")[0].startswith("405 ")
        assert cmd(c, "SET TOPIC NAME /ren/a /ren/Trash")[0].startswith("405 ")
        assert cmd(c, "SET TOPIC NAME /ren/a /ren/b") == ["200 OK"]
        assert cmd(c, "LIST TOPIC /ren/b") == ["200-OK", "200 /ren/b/deep"]
        assert cmd(c, "FIND TOPIC /ren/a")[0].startswith("404 ")
    with client(tree, "bob") as bob:
        assert cmd(bob, "SET TOPIC NAME /ren/b /ren/c")[0].startswith("404 ")


def test_remove_topic(tree):
    with client(tree) as c:
        assert cmd(c, "CREATE TOPIC /rm") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /rm/child") == ["200 OK"]
        assert cmd(c, "CREATE TOPIC /rmv > /rm/child") == ["200 OK"]
        assert cmd(c, "REMOVE TOPIC /rm") == ["200-OK", "200 0 messages pending"]
        assert cmd(c, "LIST TOPIC /rm")[0].startswith("404 ")
        assert cmd(c, "FIND TOPIC /rmv")[0].startswith("404 ")
        assert cmd(c, "CREATE TOPIC /rm") == ["200 OK"]  # the name is free again
        assert cmd(c, "REM TOPIC /rm") == ["200-OK", "200 0 messages pending"]
        assert cmd(c, "REMOVE TOPIC /rm")[0].startswith("404 ")
        assert cmd(c, "REMOVE TOPIC /accounts/bob")[0].startswith("405 ")
        assert cmd(c, "REMOVE TOPIC /accounts")[0].startswith("405 ")
    with client(tree, "bob") as bob:
        assert cmd(bob, "REMOVE TOPIC /accounts/bob")[0].startswith("405 ")


# --- visibility and permissions ---------------------------------------------------------------


def test_nothing_is_revealed_without_rights(tree):
    with client(tree, "bob") as bob:
        assert cmd(bob, "LIST TOPIC /") == ["200-OK", "200 /accounts"]
        assert cmd(bob, "LIST TOPIC /accounts") == ["200-OK", "200 /accounts/bob"]
        assert cmd(bob, "COUNT TOPIC /stocks")[0].startswith("404 ")
        assert cmd(bob, "FIND TOPIC /stocks")[0].startswith("404 ")
        assert cmd(bob, "FIND TOPIC /* (BLUE)") == ["200-OK", "200 0 topics"]
        assert cmd(bob, "COUNT TOPIC /*") == ["200-OK", "200 2"]  # /accounts, /accounts/bob
        assert cmd(bob, "GET TOPIC KEYWORDS /stocks/ibm")[0].startswith("404 ")
        assert cmd(bob, "SUB MESSAGE /stocks/quotes/ibm")[0].startswith("404 ")
        assert cmd(bob, "SUB MESSAGE /accounts/alice")[0].startswith("404 ")
        assert cmd(bob, "SUB MESSAGE /accounts/bob") == ["200-OK", "200 /accounts/bob"]


def test_granted_rights_inherit_down_the_tree(tree):
    manage_many(tree.env, ("grant", "bob", "/stocks", "subscribe"),  # one process: ~2 s CPU
                ("grant", "bob", "/news2", "manage"))
    with client(tree, "bob") as bob:
        assert cmd(bob, "COUNT TOPIC /stocks/*") == ["200-OK", "200 6"]
        assert cmd(bob, "LIST TOPIC /") == ["200-OK", "200-/accounts", "200-/news2", "200 /stocks"]
        assert cmd(bob, "SUB MESSAGE /stocks/quotes/ibm") == ["200-OK", "200 /stocks/quotes/ibm"]
        # manage on /news2: create below it, at any depth; a new topic inherits the right.
        assert cmd(bob, "CREATE TOPIC /news2/asia") == ["200 OK"]
        assert cmd(bob, "CREATE TOPIC /news2/asia/japan") == ["200 OK"]
        assert cmd(bob, "SET TOPIC NAME /news2/asia/japan /news2/asia/nippon") == ["200 OK"]
        assert cmd(bob, "REMOVE TOPIC /news2/asia/nippon")[0] == "200-OK"
        assert cmd(bob, "CREATE TOPIC /stocks/mine")[0].startswith("401 ")
        assert cmd(bob, "REMOVE TOPIC /stocks/ibm")[0].startswith("401 ")
        assert cmd(bob, "SET TOPIC NAME /news2/us /stocks/us")[0].startswith("401 ")
        assert cmd(bob, "SET TOPIC KEYWORD /stocks/ibm (X)")[0].startswith("401 ")
        cmd(bob, "UNSUB *")
    tree.manage("grant", "bob", "/stocks", "subscribe", "--deny")
    with client(tree, "bob") as bob:
        assert cmd(bob, "COUNT TOPIC /stocks")[0].startswith("404 ")


def test_virtual_topic_behaves_like_its_target(tree):
    tree.manage("grant", "alice", "/info/news/cnn", "subscribe")
    with client(tree, "alice") as alice:
        assert cmd(alice, "SUB MESSAGE /news") == ["200-OK", "200 /news"]
        assert cmd(alice, "UNSUB MESSAGE /news") == ["200-OK", "200 MESSAGE /news"]


# --- subscriptions ----------------------------------------------------------------------------


def test_subscribe_and_unsubscribe_wildcards(tree):
    with client(tree) as c:
        assert cmd(c, "SUBSCRIBE MESSAGE /stocks/quotes/*") == [
            "200-OK", "200-/stocks/quotes/ibm", "200-/stocks/quotes/msft",
            "200 /stocks/quotes/sony"]
        assert cmd(c, "SUB MESSAGE /*") == [
            "510 Maximum quantity exceeded (cannot subscribe to every topic)"]
        assert cmd(c, "SUB MESSAGE /nowhere")[0].startswith("404 ")
        assert cmd(c, "SUB MESSAGE /stocks/quotes/ibm")[0] == "200-OK"
        assert cmd(c, "SUB MESSAGE /weather/*") == ["200-OK", "200 /weather/*"]
        assert cmd(c, "SUB TOPIC /stocks/quotes/ibm")[0] == "200-OK"
        assert cmd(c, "SUB TOPIC /stocks/*")[0] == "200-OK"
        assert cmd(c, "SUB SUB /stocks/quotes/ibm") == ["200-OK", "200 /stocks/quotes/ibm"]
        assert cmd(c, "SUB SERVER TIMEOUT") == ["200-OK", "200 SERVER TIMEOUT"]
        assert cmd(c, "UNSUB MESSAGE /stocks/*") == [
            "200-OK", "200-MESSAGE /stocks/quotes/*", "200 MESSAGE /stocks/quotes/ibm"]
        assert cmd(c, "UNSUB MESSAGE /stocks/*")[0].startswith("404 ")
        assert cmd(c, "UNSUB TOPIC /stocks/quotes/ibm") == [
            "200-OK", "200 TOPIC /stocks/quotes/ibm"]
        assert cmd(c, "UNSUB *") == [
            "200-OK", "200-MESSAGE /weather/*", "200-TOPIC /stocks/*",
            "200-SUB /stocks/quotes/ibm", "200 SERVER TIMEOUT"]
        assert cmd(c, "UNSUB *")[0].startswith("404 ")


def test_subscriptions_survive_quit(tree):
    with client(tree, "alice") as alice:
        cmd(alice, "SUB TOPIC /accounts/alice")
        cmd(alice, "QUIT")
    with client(tree, "alice") as alice:
        assert cmd(alice, "UNSUB TOPIC *") == ["200-OK", "200 TOPIC /accounts/alice"]


# --- notifications ----------------------------------------------------------------------------


def test_topic_notifications_reach_other_sessions(tree):
    with client(tree) as watcher, client(tree) as actor:
        assert cmd(watcher, "SUB TOPIC /weather/*")[0] == "200-OK"
        assert cmd(watcher, "SUB TOPIC /weather")[0] == "200-OK"
        assert cmd(actor, "CREATE TOPIC /weather/us") == ["200 OK"]
        assert read_notification(watcher) == ["NOTIFY TOPIC /weather/us", "Action: ADDED"]
        assert cmd(actor, "SET TOPIC KEYWORD /weather/us (RAIN,WIND)") == ["200 OK"]
        assert read_notification(watcher) == [
            "NOTIFY TOPIC /weather/us", "Action: KEYWORDS RAIN,WIND"]
        assert cmd(actor, "SET TOPIC NAME /weather/us /weather/usa") == ["200 OK"]
        assert read_notification(watcher) == [
            "NOTIFY TOPIC /weather/us", "Action: RENAME /weather/usa"]
        assert cmd(actor, "REMOVE TOPIC /weather/usa")[0] == "200-OK"
        assert read_notification(watcher) == ["NOTIFY TOPIC /weather/usa", "Action: DELETED"]
        cmd(watcher, "UNSUB TOPIC *")


def test_subscriber_count_notifications(tree):
    with client(tree) as publisher:
        assert cmd(publisher, "SUB SUB /stocks/quotes/msft")[0] == "200-OK"
        with client(tree, "jtegen") as other:
            tree.manage("grant", "jtegen", "/stocks/quotes", "subscribe")
            assert cmd(other, "SUB MESSAGE /stocks/quotes/msft")[0] == "200-OK"
            assert read_notification(publisher) == ["NOTIFY SUB /stocks/quotes/msft", "Count: 1"]
            assert cmd(other, "UNSUB MESSAGE /stocks/quotes/msft")[0] == "200-OK"
            assert read_notification(publisher) == ["NOTIFY SUB /stocks/quotes/msft", "Count: 0"]
        cmd(publisher, "UNSUB *")


def test_suspend_holds_notifications_until_resume(tree):
    with client(tree) as watcher, client(tree) as actor:
        cmd(watcher, "SUB TOPIC /info/*")
        assert cmd(watcher, "SET NOTIFY SUSPEND") == ["200 OK"]
        assert cmd(actor, "CREATE TOPIC /info/held") == ["200 OK"]
        time.sleep(scaled(0.5))
        assert cmd(watcher, "NOOP") == ["200 OK"]
        assert nothing_pending(watcher)
        assert cmd(watcher, "SET NOTIFY RES") == ["200 OK"]
        assert read_notification(watcher) == ["NOTIFY TOPIC /info/held", "Action: ADDED"]
        assert cmd(watcher, "SET NOTIFY RESUME") == ["200 OK"]  # ignored, still answered
        cmd(watcher, "UNSUB *")


# --- login details and SCRAM ------------------------------------------------------------------


def test_set_login_details(tree):
    with client(tree, "alice") as alice:
        assert cmd(alice, "SET LOGIN NAME Jayne Smith") == ["200 OK"]
        assert cmd(alice, "SET LOGIN EMAIL jayne@example.com") == ["200 OK"]
        assert cmd(alice, "SET LOGIN ADDRESS 1 Main St, Springfield") == ["200 OK"]
        assert cmd(alice, "SET LOGIN PHONE +1 555 0100") == ["200 OK"]
        assert cmd(alice, "SET LOGIN EMAIL not-an-address")[0].startswith("400 ")
    out = tree.manage(
        "shell", "--no-imports", "-c",
        "from accounts.models import Account as A; a = A.objects.get(username='alice'); "
        "print(repr((a.proper_name, a.email, a.postal_address, a.phone)))").stdout
    assert out.strip() == repr(("Jayne Smith", "jayne@example.com", "1 Main St, Springfield",
                                "+1 555 0100"))


def test_set_login_password(tree):
    with client(tree, "jtegen") as c:
        assert cmd(c, "SET LOGIN PASSWORD KERBEROS/4.0")[0].startswith("405 ")
        assert cmd(c, "SET LOGIN PASSWORD CLEAR/1.0") == ["200 OK"]
        assert cmd(c, "PASS wrong newpw")[0].startswith("401 ")
        assert cmd(c, "SET LOGIN PASS CLEAR/1.0") == ["200 OK"]
        assert cmd(c, "PASS pw newpw") == ["200 OK"]
    with RawClient(tree.host, tree.port) as c:
        c.read_line()
        cmd(c, "LOGIN jtegen CLEAR/1.0")
        assert cmd(c, "PASS jtegen pw")[0].startswith("401 ")
        cmd(c, "LOGIN jtegen CLEAR/1.0")
        assert cmd(c, "PASS jtegen newpw")[0] == "200-OK"
        cmd(c, "SET LOGIN PASSWORD CLEAR/1.0")
        assert cmd(c, "PASS newpw pw") == ["200 OK"]


def scram_login(broker, user: str, password: str) -> tuple[list[str], list[str]]:
    """Run the SCRAM-SHA-256 exchange; returns (the lines before the reply, the reply)."""
    with RawClient(broker.host, broker.port) as c:
        c.read_line()
        assert cmd(c, f"LOGIN {user} SCRAM-SHA-256/1.0") == ["200-OK", "200 + "]
        scram = ScramClient(user, password)
        c.send_line(base64.b64encode(scram.first()).decode())
        challenge = c.read_line().decode().rstrip("\r\n")
        if not challenge.startswith("+ "):
            return [], [challenge]
        c.send_line(base64.b64encode(scram.final(base64.b64decode(challenge[2:]))).decode())
        line = c.read_line().decode().rstrip("\r\n")
        if not line.startswith("+ "):
            return [challenge], [line]
        scram.verify(base64.b64decode(line[2:]))
        reply = read_reply(c)
        if reply[-1].startswith("200 Guid"):
            assert cmd(c, "NOOP") == ["200 OK"]
        return [challenge, line], reply


def test_scram_sha_256_login(tree):
    _, reply = scram_login(tree, "alice", "pw")
    assert reply[:2] == ["200-OK", "200-Topic: /accounts/alice"]
    assert reply[-1].startswith("200 Guid: alice")


def test_scram_failures_do_not_reveal_accounts(tree):
    _, wrong = scram_login(tree, "alice", "not-it")
    _, unknown = scram_login(tree, "nosuch" + uuid.uuid4().hex[:6], "x")
    assert wrong == unknown == ["401 Unauthorized"]


def test_scram_garbage_is_refused_cleanly(tree):
    with RawClient(tree.host, tree.port) as c:
        c.read_line()
        cmd(c, "LOGIN alice SCRAM-SHA-256/1.0")
        c.send_line("!!!not base64!!!")
        assert read_reply(c)[0].startswith("401 ")
        assert cmd(c, "NOOP") == ["200 OK"]


def test_server_still_healthy(tree):
    assert tree.alive()
    assert "Traceback" not in tree.log()
    s = socket.create_connection((tree.host, tree.port))
    s.close()


def test_a_topic_and_right_made_elsewhere_count_at_once_for_a_refusal(tmp_path):
    """A topic and a subscribe right made by another process (here ``manage.py``; the admin
    or another listener alike) a moment before: the listener's caches hear of them a poll
    later (SMQP_CACHE_POLL_SECONDS, a minute here), but a 404 or 401 is given only once a
    fresh read of Redis's change counters confirms it, so SUB MESSAGE succeeds at once."""
    with fresh_listener("sqlite", tmp_path, {"SMQP_CACHE_POLL_SECONDS": "60"}) as broker:
        bob = client(broker, "bob")
        try:
            assert cmd(bob, "COUNT TOPIC /*")[0].startswith("200")  # caches loaded now
            assert cmd(bob, "SUB MESSAGE /elsewhere")[-1].startswith("404")
            made = "from topics.models import Topic\nTopic.objects.create(path='/elsewhere')"
            broker.manage("shell", "--no-imports", "-c", made)
            # It exists now, but bob may not see it (404, never a 401 that would tell).
            assert cmd(bob, "SUB MESSAGE /elsewhere")[-1].startswith("404")
            broker.manage("grant", "bob", "/elsewhere", "subscribe")
            assert cmd(bob, "SUB MESSAGE /elsewhere") == ["200-OK", "200 /elsewhere"]
            # Known now to the whole listener, its storage process too: a PUB reaches bob.
            root = client(broker)
            try:
                root.send(pub("E1", "/elsewhere"))
                assert read_reply(root)[-1].startswith("200 E1 ")
            finally:
                root.close()
            assert bob.read_line() == b"NOTIFY MESSAGE /elsewhere\r\n"
        finally:
            bob.close()


def test_a_session_sees_what_was_changed_elsewhere_before_it_logged_in(tmp_path):
    """A right denied and a topic made by another process are in force for every session
    that logs in after they committed, though the listener's caches would hear of them only
    a poll later (a minute here): a login reads the shared change counters."""
    with fresh_listener("sqlite", tmp_path, {"SMQP_CACHE_POLL_SECONDS": "60"}) as broker:
        made = "from topics.models import Topic\nTopic.objects.create(path='/kept')"
        # (Another process for both changes: one manage.py start costs ~2 s of CPU.)
        manage_many(broker.env, ("shell", "--no-imports", "-c", made),
                    ("grant", "bob", "/kept", "subscribe"))
        with client(broker, "bob") as bob:
            assert cmd(bob, "COUNT TOPIC /kept") == ["200-OK", "200 0"]  # caches loaded now
            assert cmd(bob, "LIST TOPIC /") == ["200-OK", "200-/accounts", "200 /kept"]
        broker.manage("grant", "bob", "/kept", "subscribe", "--deny")
        with client(broker, "bob") as bob:
            assert cmd(bob, "COUNT TOPIC /kept")[0].startswith("404 ")
        made = ("from topics.models import Topic\n"
                "Topic.objects.create(path='/kept/new', parent=Topic.objects.get(path='/kept'))")
        manage_many(broker.env, ("grant", "bob", "/kept", "subscribe"),
                    ("shell", "--no-imports", "-c", made))
        with client(broker, "bob") as bob:
            assert cmd(bob, "LIST TOPIC /kept") == ["200-OK", "200 /kept/new"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_publish_to_a_topic_and_right_made_elsewhere_counts_at_once(tmp_path, backend):
    """PUB, like the other commands, gives a 404 or 401 only from fresh caches: a topic and
    a publish right made by another process a moment ago (the admin, the REST API) take a
    session's pipelined publishes at once, in order, though the caches would hear of them
    only a poll later (a minute here)."""
    with fresh_listener(backend, tmp_path, {"SMQP_CACHE_POLL_SECONDS": "60"}) as broker:
        with client(broker, "bob") as bob:
            assert cmd(bob, "COUNT TOPIC /*")[0].startswith("200")  # caches loaded now
            bob.send(pub("L1", "/late"))
            assert read_reply(bob)[-1].startswith("404 ")
            made = "from topics.models import Topic\nTopic.objects.create(path='/late')"
            broker.manage("shell", "--no-imports", "-c", made)
            bob.send(pub("L2", "/late"))
            assert read_reply(bob)[-1].startswith("404 ")  # bob may not see it (never a 401)
            broker.manage("grant", "bob", "/late", "publish")
            bob.send(pub("L3", "/late") + pub("L4", "/late") + pub("L5", "/nowhere"))
            third, fourth, fifth = read_reply(bob), read_reply(bob), read_reply(bob)
            assert third[-1].startswith("200 L3 ") and fourth[-1].startswith("200 L4 ")
            assert int(third[-1].split()[2]) < int(fourth[-1].split()[2])  # publish order
            assert fifth[-1].startswith("404 ")  # a topic that is not there still is not
        with client(broker) as root:
            assert cmd(root, "COUNT MESSAGE /late") == ["200-OK", "200 2"]
