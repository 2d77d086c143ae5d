"""The README's walkthroughs, followed step by step against a real broker, so the README
cannot go stale.

A walkthrough's blocks are marked in README.md with an HTML comment just before the fence:

- ``<!-- walkthrough: NAME -->``: shell commands, run with ``bash -e`` in a fresh shell (a
  new terminal: nothing exported by an earlier block carries over) from a working directory
  laid out like a checkout after ``make run``: ``.venv`` (this interpreter's virtualenv),
  ``manage.py`` and ``var/admin-password``;
- ``<!-- walkthrough: NAME background -->``: a command that runs until stopped (a
  subscriber): started in the background, the next step waits for its first line (on stdout
  or stderr), and it is killed at the end;
- ``<!-- walkthrough: NAME fails -->``: commands whose last one must fail (non-zero exit);
- ``<!-- walkthrough: NAME output -->``: what the previous command block prints on stdout;
- ``<!-- walkthrough: NAME background-output -->``: what the background command prints; the
  values that differ per run (``smuid``/``cmuid`` prefixes naming the server and session,
  ``Created:`` times) are matched loosely, everything else exactly.

The only thing changed in a block is the port the README names (``SMQP_PORT=7200``, and the
like), replaced by the port of the test's listener. GnuPG, where a walkthrough uses it, gets
a keyring of the test's own (``GNUPGHOME``), not the user's.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    BrokerProcess,
    daphne,
    fresh_database,
    listener,
    run_manage,
    stop_listener,
)
from tests.e2e.qqp.test_qqp import start_qqp
from tests.support.smqp_session import Session
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
MARKER = re.compile(
    r"^<!-- walkthrough: (?P<name>[\w-]+)(?: (?P<kind>[\w-]+))? -->\n+"
    r"```[\w-]*\n(?P<body>.*?)^```", re.M | re.S)
# Generous: the machine is shared; these bound a hang, they are not timing assertions.
STEP_TIMEOUT = 180
WAIT = 120


@dataclass
class Step:
    kind: str  # "run", "background", "output", "background-output"
    body: str


def walkthrough(name: str) -> list[Step]:
    steps = [Step(m["kind"] or "run", m["body"]) for m in MARKER.finditer(README.read_text())
             if m["name"] == name]
    assert steps, f"README.md has no blocks marked <!-- walkthrough: {name} -->"
    return steps


def loose_pattern(expected: str) -> re.Pattern:
    """``expected`` as a regex over the output: smuid/cmuid keep their last part (the
    number, the publisher's cmuid), ``Created:`` any time; the rest as written."""
    lines = []
    for line in expected.rstrip("\n").splitlines():
        regex = ""
        for part in re.split(r"((?:smuid|cmuid) \S+/|Created: \S+)", line.rstrip()):
            if re.fullmatch(r"(?:smuid|cmuid) \S+/", part):
                regex += re.escape(part.split()[0]) + r" \S+/"
            elif part.startswith("Created: "):
                regex += r"Created: \S+"
            else:
                regex += re.escape(part)
        lines.append(regex + r"[ \t]*")
    return re.compile(r"^" + r"\n".join(lines) + r"$", re.M)


class Walker:
    """Runs a walkthrough's blocks in ``workdir`` with the broker's environment (its
    database and var directory; no port or password: the blocks set those)."""

    def __init__(self, workdir: Path, env: dict[str, str], ports: dict[str, int]):
        self.workdir, self.env, self.ports = workdir, env, ports
        self.background: list[tuple[subprocess.Popen, Path, Path]] = []

    def script(self, body: str) -> str:
        for variable, port in self.ports.items():
            body = re.sub(rf"\b{variable}=\d+\b", f"{variable}={port}", body)
        return body

    def run(self, body: str, fails: bool = False) -> str:
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", self.script(body)], cwd=self.workdir,
            env=self.env, capture_output=True, text=True, timeout=scaled(STEP_TIMEOUT),
            stdin=subprocess.DEVNULL)
        assert (result.returncode != 0) == fails, (
            f"walkthrough step {'succeeded' if fails else 'failed'} "
            f"({result.returncode}):\n{body}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        return result.stdout

    def start(self, body: str) -> None:
        n = len(self.background)
        out, err = self.workdir / f"bg{n}.out", self.workdir / f"bg{n}.err"
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", self.script(body)], cwd=self.workdir,
                env=self.env, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.background.append((proc, out, err))
        deadline = time.monotonic() + scaled(WAIT)
        while not (out.read_text() or err.read_text()):
            assert proc.poll() is None, f"{body} ended: {err.read_text()}"
            assert time.monotonic() < deadline, f"{body} printed nothing"
            time.sleep(0.1)

    def wait_output(self, pattern: re.Pattern) -> None:
        proc, out, err = self.background[-1]
        deadline = time.monotonic() + scaled(WAIT)
        while not pattern.search(out.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"background step never printed {pattern.pattern!r}:\n"
                f"stdout:\n{out.read_text()}\nstderr:\n{err.read_text()}")
            time.sleep(0.1)

    def follow(self, steps: list[Step]) -> None:
        last = ""
        for step in steps:
            if step.kind == "run":
                last = self.run(step.body)
            elif step.kind == "fails":
                last = self.run(step.body, fails=True)
            elif step.kind == "background":
                self.start(step.body)
            elif step.kind == "output":
                assert last.strip() == step.body.strip(), (
                    f"README shows:\n{step.body}\nthe step printed:\n{last}")
            elif step.kind == "background-output":
                self.wait_output(loose_pattern(step.body))
            else:
                raise AssertionError(f"unknown walkthrough block kind {step.kind!r}")

    def stop(self) -> None:
        for proc, _, _ in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=scaled(30))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def checkout(base: Path) -> Path:
    """A directory laid out as the README assumes (the project root after ``make run``):
    ``.venv`` is this interpreter's virtualenv, ``manage.py`` the project's."""
    workdir = base / "checkout"
    (workdir / "var").mkdir(parents=True)
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    (workdir / "manage.py").symlink_to(ROOT / "manage.py")
    (workdir / "tests").symlink_to(ROOT / "tests")
    assert (workdir / ".venv" / "bin" / "smqp").exists(), "the smqp client is not installed"
    return workdir


@contextmanager
def make_run_state(base: Path) -> Iterator[tuple[Path, dict[str, str], BrokerProcess]]:
    """A broker as ``make run`` leaves it: an empty database with the superuser ``admin``,
    whose password is in ``var/admin-password``, and the listener on a free port:
    (the checkout, the broker's environment, the listener)."""
    workdir = checkout(base)
    with fresh_database("sqlite", base) as env:
        password = secrets.token_urlsafe(12)
        run_manage(env, "shell", "--no-imports", "-c",
                   "from accounts.models import Account\n"
                   f"Account.objects.create_superuser('admin', '', {password!r})\n")
        (workdir / "var" / "admin-password").write_text(password + "\n")
        with listener(env, base, name="walkthrough") as broker:
            yield workdir, env, broker


@pytest.fixture
def smqp_walker(tmp_path) -> Iterator[Walker]:
    with make_run_state(tmp_path) as (workdir, env, broker):
        walker = Walker(workdir, env, {"SMQP_PORT": broker.port})
        try:
            yield walker
        finally:
            walker.stop()


@contextmanager
def walking_with_http(tmp_path: Path) -> Iterator[tuple[Walker, Path, BrokerProcess]]:
    """A walker with the ports of ``make run``'s state: the listener and Daphne."""
    with make_run_state(tmp_path) as (workdir, env, broker), daphne(env, tmp_path) as url:
        walker = Walker(workdir, env, {"SMQP_PORT": broker.port,
                                       "HTTP_PORT": int(url.rsplit(":", 1)[1])})
        try:
            yield walker, workdir, broker
        finally:
            walker.stop()


def test_smqp_walkthrough(smqp_walker):
    """Using SMQP over TCP: accounts, /news and its grants, a subscriber, a publish, the
    subscriber's print-out."""
    steps = walkthrough("smqp")
    assert [s.kind for s in steps] == ["run", "background", "run", "output",
                                      "background-output"]
    smqp_walker.follow(steps)


@pytest.fixture
def gnupg_home() -> Iterator[Path]:
    """A keyring of the test's own, at a short path (gpg-agent's socket lives there); its
    agent is stopped afterwards."""
    if shutil.which("gpg") is None:
        pytest.fail("the QQP walkthrough uses GnuPG: install gpg")
    home = Path(tempfile.mkdtemp(prefix="gpg-"))
    home.chmod(0o700)
    try:
        yield home
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"],
                       env={**os.environ, "GNUPGHOME": str(home)}, capture_output=True,
                       timeout=scaled(60))
        shutil.rmtree(home, ignore_errors=True)


def test_qqp_walkthrough(tmp_path, gnupg_home):
    """QQP ingestion: a topic, an account with a GnuPG key, a signed file stored, the same
    file unsigned refused with the setting that would allow it named."""
    steps = walkthrough("qqp")
    assert [s.kind for s in steps] == ["run", "run", "output", "fails", "output"]
    with make_run_state(tmp_path) as (workdir, env, broker):
        qqp = start_qqp(env, tmp_path)
        try:
            walker = Walker(workdir, {**env, "GNUPGHOME": str(gnupg_home)},
                            {"SMQP_PORT": broker.port, "SMQP_QQP_PORT": qqp.port})
            walker.follow(steps)
        finally:
            walker.stop()
            stop_listener(qqp)
        with Session(broker.host, broker.port, "admin",
                     (workdir / "var" / "admin-password").read_text().strip()) as admin:
            reply = admin.command("COUNT MESSAGE /orders")
            assert reply.code == 200 and reply.lines[-1].split()[-1] == "1", reply


def test_xmpp_walkthrough(tmp_path):
    """XMPP PubSub over WebSocket: the stanza example subscribes one account and publishes
    as another; the subscriber prints the item."""
    clients = ROOT / "tests" / "xmpp_clients" / "node_modules" / "stanza"
    if shutil.which("node") is None or not clients.is_dir():
        pytest.fail("the XMPP walkthrough needs node and the npm clients (make test runs "
                    "npm ci in tests/xmpp_clients)")
    steps = walkthrough("xmpp")
    assert [s.kind for s in steps] == ["run", "background", "run", "output",
                                      "background-output"]
    with walking_with_http(tmp_path) as (walker, _workdir, _broker):
        walker.follow(steps)


def test_rest_walkthrough(tmp_path):
    """REST API: an account, topics and a grant, a token from the password, a publish."""
    steps = walkthrough("rest")
    assert [s.kind for s in steps] == ["run", "run", "output"]
    with walking_with_http(tmp_path) as (walker, _workdir, _broker):
        walker.follow(steps)


def test_admin_walkthrough(tmp_path):
    """Administration CLI: a topic, an account and its grant made with ``smqp admin``, three
    orders waiting, then overview, sessions, consumers, peek, export / import, a password
    reset, grants and the purge with its count."""
    steps = walkthrough("admin")
    assert [s.kind for s in steps] == ["run", "run", "output"]
    with walking_with_http(tmp_path) as (walker, workdir, broker):
        walker.follow(steps)
        # What the walkthrough did is in the store: carol logs in with her new password, is
        # /orders' one subscriber, and its three orders are in its Trash.
        with Session(broker.host, broker.port, "carol", "carol-pw-2"):
            pass
        with Session(broker.host, broker.port, "admin",
                     (workdir / "var" / "admin-password").read_text().strip()) as admin:
            reply = admin.command("COUNT SUBSCRIBERS /orders")
            assert reply.code == 200 and reply.lines[-1].split()[-1] == "1", reply
            reply = admin.command("COUNT MESSAGE /orders/Trash")
            assert reply.code == 200 and reply.lines[-1].split()[-1] == "3", reply
