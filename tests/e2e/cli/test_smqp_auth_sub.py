"""Issue 36, item 3: ``smqp`` logs in with SCRAM-SHA-256 by default (CLEAR on request),
``sub --selector --lease``, a warning when messages of the account's other subscriptions
come to ``sub``, and the shell never running a message body into the next reply. Driven as
a subprocess against a real listener."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT, manage_many
from tests.e2e.cli.test_smqp import broker, cli_env, smqp  # noqa: F401 (the fixture)
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled, wait_until

pytestmark = pytest.mark.e2e


def last_login_method(broker, account: str) -> str:  # noqa: F811
    out = broker.manage("shell", "--no-imports", "-c", (
        "from accounts.models import LoginSession\n"
        f"print(LoginSession.objects.filter(account__username={account!r})"
        ".order_by('-pk').values_list('auth_method', flat=True).first())\n")).stdout
    return out.strip().splitlines()[-1]


def test_scram_is_the_default_login_and_clear_is_asked_for(broker):  # noqa: F811
    listed = smqp(cli_env(broker, "bob"), "topics")
    assert listed.returncode == 0, listed.stderr
    assert last_login_method(broker, "bob") == "SCRAM-SHA-256/1.0"
    clear = smqp(cli_env(broker, "bob"), "topics", "--auth", "clear")
    assert clear.returncode == 0, clear.stderr
    assert last_login_method(broker, "bob") == "CLEAR/1.0"
    env = {**cli_env(broker, "bob"), "SMQP_PASSWORD": "wrong"}
    for method in ("scram", "clear"):
        failed = smqp(env, "topics", "--auth", method)
        assert failed.returncode == 4, failed.stderr
        assert failed.stderr.startswith("smqp: error: login as bob failed: 401")


def test_sub_with_a_selector_and_a_lease(broker):  # noqa: F811
    sub = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "sub", "/news", "--json", "--count", "1",
         "--selector", "JMS Priority < 3", "--lease", "00:10:00"],
        env=cli_env(broker, "bob"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert "subscribed to /news" in sub.stderr.readline()
        with Session(broker.host, broker.port, "alice") as alice:
            smuid_of(alice.publish("/news", "low", [("Priority", "5")]))
            wanted = smuid_of(alice.publish("/news", "high", [("Priority", "1")]))
        out, err = sub.communicate(timeout=scaled(60))
    finally:
        sub.kill()
    assert sub.returncode == 0, err
    assert f"/{wanted}" in out and '"high"' in out and '"low"' not in out
    row = broker.manage("shell", "--no-imports", "-c", (
        "from broker.models import Subscription\n"
        "s = Subscription.objects.get(account__username='bob', pattern='/news',"
        " selector_class__gt='')\n"
        "print(s.selector_class, '|', s.selector, '|', s.lease_end is not None)\n")).stdout
    assert row.strip().splitlines()[-1] == "JMS | Priority < 3 | True"
    bad = smqp(cli_env(broker, "bob"), "sub", "/news", "--selector", "JMS Priority <")
    assert bad.returncode == 1 and "567" in bad.stderr
    usage = smqp(cli_env(broker, "bob"), "sub", "/news", "--selector", "JMS")
    assert usage.returncode == 2


def test_sub_warns_about_messages_of_other_subscriptions(broker):  # noqa: F811
    with Session(broker.host, broker.port, "root") as root:
        assert root.command("CREATE TOPIC /other").code == 200
    manage_many(broker.env, ("grant", "alice", "/other", "publish"),
                ("grant", "bob", "/other", "subscribe"))
    # No wait for the listener's UAL cache: bob's login reads the generation the grants bumped.
    with Session(broker.host, broker.port, "bob") as bob:
        assert bob.command("SUB MESSAGE /other").code == 200
    with Session(broker.host, broker.port, "alice") as alice:
        smuid_of(alice.publish("/other", "elsewhere"))
    sub = smqp(cli_env(broker, "bob"), "sub", "/news", "--count", "1", "--json")
    assert sub.returncode == 0, sub.stderr
    assert '"elsewhere"' in sub.stdout
    assert "smqp: warning: /other comes through another subscription of bob" in sub.stderr
    with Session(broker.host, broker.port, "bob") as bob:
        assert bob.command("UNSUB MESSAGE /other").code == 200


def test_the_shell_never_runs_a_body_into_a_reply(broker, tmp_path):  # noqa: F811
    """Messages arrive (the reader thread prints them) while replies are printed (the
    prompt loop): each body stays on its own lines, never glued to a reply line."""
    shell = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "shell"], env=cli_env(broker, "bob", tmp_path),
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    # Its output is read as it comes (the shell flushes each block), so that the test waits
    # for what it prints rather than for fixed times.
    printed: dict[str, list[str]] = {"out": [], "err": []}

    def read(stream, into: list[str]) -> None:
        for line in iter(stream.readline, ""):
            into.append(line)

    readers = [threading.Thread(target=read, args=(shell.stdout, printed["out"]), daemon=True),
               threading.Thread(target=read, args=(shell.stderr, printed["err"]), daemon=True)]
    for reader in readers:
        reader.start()

    def shown_so_far() -> str:
        return "".join(printed["out"])

    try:
        shell.stdin.write("SUBSCRIBE MESSAGE /news\n")
        shell.stdin.flush()
        # The subscription is made once the shell prints its reply (the only command so far).
        wait_until(lambda: re.search(r"(^|> )200 ", shown_so_far(), re.M), 30,
                   message="the shell's SUBSCRIBE reply")
        with Session(broker.host, broker.port, "alice") as alice:
            for i in range(40):
                alice.send_publish("/news", f"c{i}", sections=[
                    ("text/plain", b"line one\r\n(should arrive)")])
                shell.stdin.write("LIST TOPIC /\nNOOP\n")
                shell.stdin.flush()
            for _ in range(40):
                assert alice.reply().code == 200
        # QUIT once every message has been shown (a QUIT before would drop the rest).
        wait_until(lambda: shown_so_far().count("(should arrive)") >= 40, 30,
                   message="40 messages shown by the shell")
        shell.stdin.write("QUIT\n")
        shell.stdin.close()
        shell.wait(timeout=scaled(60))
        for reader in readers:
            reader.join(scaled(30))
        out, err = shown_so_far(), "".join(printed["err"])
    finally:
        shell.kill()
    assert shell.returncode == 0, err
    lines = out.splitlines()
    shown = [line for line in lines if "(should arrive)" in line]
    assert len(shown) == 40, out[-2000:]
    assert set(shown) == {"(should arrive)"}, [x for x in shown if x != "(should arrive)"]
    # The CR in the body is shown, not obeyed.
    assert sum(line == "line one\\x0d" for line in lines) == 40
