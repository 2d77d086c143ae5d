"""A whole broker for the operators' console tests: ``runsmqp`` and Daphne on one fresh
database (SQLite or PostgreSQL), with accounts, topics and rights for known traffic:

- ``/ops/a`` (fan-out): alice publishes, bob subscribes;
- ``/ops/d`` (fan-out, retry timeout 1 s, 1 retry): alice publishes, jtegen subscribes and
  never ACKs, so his deliveries go dead (dead letters to republish);
- ``/ops/q`` (queue mode): alice publishes, bob subscribes (a lock while he holds one).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import (
    BrokerProcess,
    accounts_script,
    daphne,
    fresh_database,
    listener,
    run_manage,
)
from tests.support.timing import scaled

METRICS_TOKEN = "ops-test-token"


@dataclass
class OpsStack:
    http: str
    smqp: BrokerProcess
    env: dict[str, str]

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
        """Run ``code`` (which sets ``result``) in ``manage.py shell``; its JSON value."""
        out = run_manage(
            self.env,
            "shell",
            "--no-imports",
            "-c",
            code + "\nimport json\nprint('RESULT=' + json.dumps(result))",
        ).stdout
        line = [x for x in out.splitlines() if x.startswith("RESULT=")][-1]
        return json.loads(line[len("RESULT=") :])


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
    with fresh_database(backend, base, extra) as env:
        # Accounts, topics and the grants (``manage.py grant``) in one process: each
        # ``manage.py`` start costs ~2 s of CPU.
        run_manage(
            env,
            "shell",
            "--no-imports",
            "-c",
            accounts_script("root", "bob", "alice", "jtegen") + SETUP + GRANTS,
        )
        with (
            listener(env, base, name=f"ops-{backend}") as smqp,
            daphne(env, base, f"daphne-{uuid.uuid4().hex[:6]}.log") as http,
        ):
            yield OpsStack(http, smqp, env)


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
