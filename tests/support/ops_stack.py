"""A whole broker for the operators' console tests: ``runsmqp`` and Daphne on one fresh
database (SQLite or PostgreSQL), with accounts, topics and rights for known traffic:

- ``/ops/a`` (fan-out): alice publishes, bob subscribes;
- ``/ops/d`` (fan-out, retry timeout 1 s, 1 retry): alice publishes, jtegen subscribes and
  never ACKs, so his deliveries go dead (dead letters to republish);
- ``/ops/q`` (queue mode): alice publishes, bob subscribes (a lock while he holds one).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import (
    BrokerProcess,
    daphne,
    fresh_database,
    listener,
)
from tests.support.store_shell import StoreShell
from tests.support.timing import scaled

METRICS_TOKEN = "ops-test-token"


@dataclass
class OpsStack:
    http: str
    smqp: BrokerProcess
    env: dict[str, str]
    shell: StoreShell = field(repr=False)

    def get(self, path: str, token: str | None = METRICS_TOKEN) -> tuple[int, str]:
        request = urllib.request.Request(self.http + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=scaled(30)) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def store(self, code: str) -> object:
        """Run ``code`` (which sets ``result``) with Django on the stack's database; its
        JSON value."""
        return self.shell.run(code)


SETUP = """
from topics.models import Topic
ops = Topic.objects.create(path="/ops")
Topic.objects.create(path="/ops/a", parent=ops)
Topic.objects.create(path="/ops/d", parent=ops, retry_timeout=1, max_retries=1)
Topic.objects.create(path="/ops/q", parent=ops, delivery_mode="queue")
"""

GRANTS = """
from django.core.management import call_command
for args in [("alice", "/ops", "publish"), ("bob", "/ops/a", "subscribe"),
             ("bob", "/ops/q", "subscribe"), ("jtegen", "/ops/d", "subscribe")]:
    call_command("grant", *args)
"""


@contextmanager
def ops_stack(backend: str, base: Path) -> Iterator[OpsStack]:
    extra = {
        "SMQP_METRICS_TOKEN": METRICS_TOKEN,
        # Nothing is sent again during a test unless the topic asks for it (/ops/d).
        "SMQP_DEFAULT_RETRY_TIMEOUT": "600",
    }
    # Accounts, topics and grants come from this process's template (one ``manage.py``
    # start per test process, not per stack).
    with fresh_database(backend, base, extra, setup=SETUP + GRANTS,
                        accounts=("root", "bob", "alice", "jtegen")) as env:
        shell = StoreShell(env, base / f"store-shell-{uuid.uuid4().hex[:6]}.log")
        try:
            with (
                listener(env, base, name=f"ops-{backend}") as smqp,
                daphne(env, base, f"daphne-{uuid.uuid4().hex[:6]}.log") as http,
            ):
                yield OpsStack(http, smqp, env, shell)
        finally:
            shell.close()


def wait_until(predicate, timeout: float = 30.0, what: str = "condition", pause: float = 0.3):
    """``predicate()``'s first true value, asked again until ``timeout``."""
    deadline = time.monotonic() + scaled(timeout)
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
