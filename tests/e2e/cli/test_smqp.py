"""The ``smqp`` command-line client, driven as a user would: a subprocess against a real
listener (``pub`` → ``sub`` round trip, ``get``, ``topics``, one-line errors with their exit
statuses), and ``smqp shell`` under a pseudo-terminal (pexpect)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pyte
import pytest

from tests.conftest import ROOT, BrokerProcess, fresh_listener, manage_many
from tests.support.smqp_session import Session
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One listener (SQLite: the CLI is a client, the backend is not what is tested) with
    /news, alice allowed to publish there, bob to subscribe."""
    with fresh_listener("sqlite", tmp_path_factory.mktemp("cli")) as b:
        with Session(b.host, b.port, "root") as root:
            assert root.command("CREATE TOPIC /news").code == 200
            assert root.command("CREATE TOPIC /typing").code == 200  # no backlog for carol
        manage_many(b.env, ("grant", "alice", "/news", "publish"),  # one start: ~2 s CPU
                    ("grant", "bob", "/news", "subscribe"),
                    ("createaccount", "carol", "--password", "pw"),
                    ("createaccount", "dave", "--password", "pw"),
                    ("grant", "alice", "/typing", "publish"),
                    ("grant", "carol", "/typing", "subscribe"),
                    ("grant", "dave", "/news", "subscribe"))
        yield b


def cli_env(broker: BrokerProcess, account: str, home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}
    env.update(SMQP_HOST=broker.host, SMQP_PORT=str(broker.port), SMQP_ACCOUNT=account,
               SMQP_PASSWORD="pw", PYTHONUNBUFFERED="1")
    if home is not None:
        env["HOME"] = str(home)
    return env


def smqp(env: dict[str, str], *args: str, stdin: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=env, cwd=ROOT,
                          input=stdin, capture_output=True, text=True, timeout=scaled(timeout))


def delivery_state(broker: BrokerProcess, account: str, smuid: int) -> str:
    out = broker.manage("shell", "--no-imports", "-c", (
        "from broker.models import Delivery\n"
        f"d = Delivery.objects.filter(account__username={account!r}, message_id={smuid}).first()\n"
        "print(d.state if d else 'none')\n")).stdout
    return out.strip().splitlines()[-1]


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_pub_sub_round_trip_acks(broker):
    sub = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "sub", "/news", "--count", "2", "--json"],
        env=cli_env(broker, "bob"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        # The subscription is made before the first message goes.
        assert "subscribed to /news" in sub.stderr.readline()
        first = smqp(cli_env(broker, "alice"), "pub", "/news", "hello from the CLI", "--json",
                     "-H", "Name=greeting")
        assert first.returncode == 0, first.stderr
        published = json.loads(first.stdout)
        assert published["topic"] == "/news" and published["smuid"] > 0
        # Data from stdin, readable output.
        second = smqp(cli_env(broker, "alice"), "pub", "/news", "--cmuid", "c-2",
                      stdin="line one\nline two\n")
        assert second.returncode == 0, second.stderr
        assert second.stdout.startswith("published to /news: smuid ")
        assert "cmuid c-2" in second.stdout
        out, err = sub.communicate(timeout=scaled(60))
    finally:
        if sub.poll() is None:
            sub.kill()
    assert sub.returncode == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [m["sections"][0]["text"] for m in got] == ["hello from the CLI",
                                                        "line one\nline two\n"]
    assert got[0]["smuid"].endswith(f"/{published['smuid']}")
    assert ["Name", "greeting"] in got[0]["headers"]
    assert got[1]["cmuid"].endswith("/c-2")
    # ACKed: the ACK reaches the database (through the ACK journal, in a moment).
    wait_for(lambda: delivery_state(broker, "bob", published["smuid"]) == "acked",
             what="bob's ACK in the store")


def test_sub_with_a_window_acks_each_by_its_smuid(broker):
    """``sub --window 4``: the messages waiting come before any ACK; each is acknowledged by
    its smuid once printed; a window above the server's Max-Window is refused."""
    smuids = [json.loads(smqp(cli_env(broker, "alice"), "pub", "/news", f"w{i}",
                              "--json").stdout)["smuid"] for i in range(3)]
    # bob's subscription to /news (made by the test above) holds them for him.
    sub = smqp(cli_env(broker, "bob"), "sub", "/news", "--window", "4", "--json", "--wait",
               "3")
    assert sub.returncode == 0, sub.stderr
    got = [json.loads(line) for line in sub.stdout.splitlines()]
    assert [int(m["smuid"].rsplit("/", 1)[1]) for m in got][-3:] == smuids
    for smuid in smuids:
        wait_for(lambda smuid=smuid: delivery_state(broker, "bob", smuid) == "acked",
                 what=f"bob's ACK of {smuid} in the store")
    refused = smqp(cli_env(broker, "bob"), "sub", "/news", "--window", "100000")
    assert refused.returncode == 1
    assert "SET refused: 400 Bad request (window must be 1 to 256)" in refused.stderr
    usage = smqp(cli_env(broker, "bob"), "sub", "/news", "--window", "0")
    assert usage.returncode == 2 and "--window" in usage.stderr


def test_get_and_topics(broker):
    pub = smqp(cli_env(broker, "alice"), "pub", "/news", "kept", "--json")
    smuid = json.loads(pub.stdout)["smuid"]
    got = smqp(cli_env(broker, "bob"), "get", "/news", str(smuid))
    assert got.returncode == 0, got.stderr
    assert "kept" in got.stdout and "smuid " in got.stdout
    as_json = smqp(cli_env(broker, "bob"), "get", "/news", str(smuid), "--json")
    [message] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert message["sections"][0]["text"] == "kept"

    topics = smqp(cli_env(broker, "root"), "topics")
    assert topics.returncode == 0, topics.stderr
    assert "/news" in topics.stdout.splitlines()
    listed = json.loads(smqp(cli_env(broker, "root"), "topics", "/", "--json").stdout)
    assert "/news" in listed["topics"]


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("smqp: error: "), lines
    return lines[0]


def test_errors_are_one_line_with_a_status(broker):
    # Refused by the server: 1.
    refused = smqp(cli_env(broker, "alice"), "pub", "/nowhere", "x")
    assert refused.returncode == 1
    assert "404" in _one_error_line(refused)
    not_allowed = smqp(cli_env(broker, "bob"), "pub", "/news", "x")
    assert not_allowed.returncode == 1
    assert "401" in _one_error_line(not_allowed)
    # Wrong password: 4.
    env = cli_env(broker, "bob")
    env["SMQP_PASSWORD"] = "wrong"
    bad_login = smqp(env, "topics")
    assert bad_login.returncode == 4
    assert "login as bob failed" in _one_error_line(bad_login)
    # Nothing listening: 3.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    env = cli_env(broker, "bob")
    env["SMQP_PORT"] = str(free)
    nothing = smqp(env, "topics")
    assert nothing.returncode == 3
    assert f"cannot connect to {broker.host}:{free}" in _one_error_line(nothing)
    # No password and no terminal to ask on: 2.
    env = cli_env(broker, "bob")
    del env["SMQP_PASSWORD"]
    no_password = smqp(env, "topics", stdin="")
    assert no_password.returncode == 2
    assert "SMQP_PASSWORD" in _one_error_line(no_password)
    # A malformed header option: 2, before anything is sent.
    bad_header = smqp(cli_env(broker, "alice"), "pub", "/news", "x", "-H", "novalue")
    assert bad_header.returncode == 2
    assert "NAME=VALUE" in _one_error_line(bad_header)


def test_password_prompt_under_a_terminal(broker, tmp_path):
    env = cli_env(broker, "root", tmp_path)
    del env["SMQP_PASSWORD"]
    child = pexpect.spawn(sys.executable, ["-m", "broker.cli", "topics"], env=env,
                          cwd=str(ROOT), encoding="utf-8", timeout=scaled(60))
    try:
        child.expect("Password for root: ")
        child.sendline("pw")
        child.expect("/news")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_shell_round_trip_under_a_pty(broker, tmp_path):
    env = cli_env(broker, "bob", tmp_path)
    bob = pexpect.spawn(sys.executable, ["-m", "broker.cli", "shell"], env=env,
                        cwd=str(ROOT), encoding="utf-8", timeout=scaled(60))
    alice = pexpect.spawn(sys.executable, ["-m", "broker.cli", "shell"],
                          env=cli_env(broker, "alice", tmp_path), cwd=str(ROOT),
                          encoding="utf-8", timeout=scaled(60))
    try:
        bob.expect(r"connected to .* as bob\d+")
        bob.expect_exact("smqp> ")
        bob.sendline("SUBSCRIBE MESSAGE /news")
        bob.expect_exact("200 /news")
        bob.expect_exact("smqp> ")
        alice.expect_exact("smqp> ")
        alice.sendline(":pub /news typed-in-the-shell")
        alice.expect(r"200 OK \S+ (\d+)\r?\n")
        smuid = int(alice.match.group(1))
        bob.expect_exact("typed-in-the-shell")
        bob.expect_exact("(acknowledged)")
        # A bad line is answered, the session goes on.
        bob.sendline("FROBNICATE")
        bob.expect(r"400 Bad request")
        bob.send("list to\t")  # Tab completes the command words
        bob.expect_exact("TOPIC ")  # the word completed in place: "list TOPIC "
        bob.sendline("/")
        bob.expect_exact("/news")
        bob.sendline(":quit")
        bob.expect(pexpect.EOF)
        alice.sendline(":quit")
        alice.expect(pexpect.EOF)
    finally:
        bob.close()
        alice.close()
    assert bob.exitstatus == 0
    wait_for(lambda: delivery_state(broker, "bob", smuid) == "acked",
             what="the shell's ACK in the store")
    # History is kept for the next session.
    history = (tmp_path / ".smqp_history").read_text()
    assert "SUBSCRIBE MESSAGE /news" in history


class Terminal:
    """``smqp shell`` under a pseudo-terminal, its output also rendered on a pyte screen: what
    the user would see, with the cursor movements and erasures applied."""

    ROWS, COLUMNS = 400, 160  # tall enough that nothing a test checks scrolls away

    def __init__(self, env: dict[str, str]) -> None:
        self.screen = pyte.Screen(self.COLUMNS, self.ROWS)
        self._stream = pyte.Stream(self.screen)
        self.child = pexpect.spawn(sys.executable, ["-m", "broker.cli", "shell"], env=env,
                                   cwd=str(ROOT), encoding="utf-8", timeout=scaled(60),
                                   dimensions=(self.ROWS, self.COLUMNS))
        self.child.logfile_read = self  # pexpect hands every read here too

    def write(self, text: str) -> None:
        self._stream.feed(text)

    def flush(self) -> None:
        pass

    def rows(self) -> list[str]:
        """The screen's rows down to the last one written, right-trimmed."""
        rows = [row.rstrip() for row in self.screen.display]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def quit(self) -> None:
        self.child.sendline(":quit")
        self.child.expect(pexpect.EOF)
        self.child.close()
        assert self.child.exitstatus == 0


def test_shell_prints_a_message_above_the_line_being_typed(broker, tmp_path):
    """A message that comes while a line is half typed is printed above that line: the
    prompt and the typed text are written again below it, and the line goes on as typed."""
    carol = Terminal(cli_env(broker, "carol", tmp_path))
    try:
        carol.child.expect_exact("smqp> ")
        carol.child.sendline("SUBSCRIBE MESSAGE /typing")
        carol.child.expect_exact("200 /typing")
        carol.child.expect_exact("smqp> ")
        carol.child.send("LIST TOP")
        carol.child.expect_exact("LIST TOP")
        pub = smqp(cli_env(broker, "alice"), "pub", "/typing", "came-while-typing")
        assert pub.returncode == 0, pub.stderr
        carol.child.expect_exact("(acknowledged)")
        carol.child.expect_exact("smqp> LIST TOP")  # written again, below the message
        rows = carol.rows()
        body = rows.index("came-while-typing")
        top = max(i for i, row in enumerate(rows[:body]) if row.startswith("── /typing  smuid "))
        assert all(row.startswith("   ") for row in rows[top + 1:body]), rows  # its headers
        assert rows[body + 1:] == ["(acknowledged)", "smqp> LIST TOP"], rows
        # The half-typed line was erased before the message, not left above it.
        assert "smqp> LIST TOP" not in rows[:top], rows
        assert carol.screen.cursor.x == len("smqp> LIST TOP")  # typing goes on at its end
        carol.child.send("IC /\r")  # the line readline kept: LIST TOPIC /
        carol.child.expect_exact("/typing")
        carol.child.expect_exact("smqp> ")
        carol.quit()
    finally:
        carol.child.close()


def test_shell_prompt_stays_whole_while_the_backlog_is_printed(broker, tmp_path):
    """Messages waiting at login are printed while ``input()`` writes the first prompt: the
    prompt is never split by them (a pty test once read ``kept\\r\\nmqp>``), and every
    message is shown whole, with the prompt alone on the last row."""
    with Session(broker.host, broker.port, "dave") as dave:
        assert dave.command("SUBSCRIBE MESSAGE /news").code == 200
    bodies = [f"waiting-{i:02}" for i in range(25)]
    with Session(broker.host, broker.port, "alice") as alice:
        for body in bodies:
            assert alice.publish("/news", body).code == 200
    dave = Terminal(cli_env(broker, "dave", tmp_path))
    try:
        dave.child.expect_exact(bodies[-1])  # the last published, shown last
        dave.child.expect_exact("(acknowledged)")
        dave.child.sendline("NOOP")
        dave.child.expect(r"200 .*\r?\n")
        dave.child.expect_exact("smqp> ")
        rows = dave.rows()
        for body in bodies:
            assert body in rows, rows  # alone on its row: nothing written into it
        # (dave's new subscription was also sent the messages /news held before)
        shown = sum(row.startswith("── /news  smuid ") for row in rows)
        assert shown >= len(bodies) and rows.count("(acknowledged)") == shown, rows
        prompts = [row for row in rows if "smqp>" in row]
        # The backlog's prompt, then NOOP's: each printed whole, nothing else on its row.
        assert prompts[-1] == "smqp>", rows
        assert all(row in ("smqp>", "smqp> NOOP") for row in prompts), rows
        dave.quit()
    finally:
        dave.child.close()


def test_console_script_is_declared():
    """pyproject's [project.scripts] names main(), which runs (--help exits 0)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["smqp"] == "broker.cli.main:main"
    from broker.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


def test_shell_reads_a_pipe(broker, tmp_path):
    """The README's first step: lines piped into ``smqp shell`` (no terminal)."""
    result = smqp(cli_env(broker, "root", tmp_path), "shell",
                  stdin="CREATE TOPIC /piped\nLIST TOPIC /\n")
    assert result.returncode == 0, result.stderr
    assert "/piped" in result.stdout  # LIST TOPIC's reply, printed
    listed = smqp(cli_env(broker, "root"), "topics", "--json")
    assert "/piped" in json.loads(listed.stdout)["topics"]
