"""Brokers linked to one another for the federation tests (profile §9.5): each a real
listener (``runsmqp``) and a real link supervisor (``runlinks``) on a database of its own,
with its own server context (``a.test``, ``b.test``, ...).

On each domain X: ``bob`` (password ``pw``) publishes and subscribes on ``/news`` and may
subscribe below every link root; for each peer P an account ``peer_P`` (a remote server: the
account P's link logs in with here) with the ``remote`` right on ``/news`` and on every link
root (so that a message may travel on, and a loop can be seen being dropped); and a link
named P (what P sends is stored below ``/P``) logging in to P as ``peer_X``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import (
    ROOT,
    BrokerProcess,
    fresh_database,
    run_manage,
    start_listener,
    stop_process,
)

FAST_LINKS = {"SMQP_LINK_BACKOFF_MAX": "1", "SMQP_LINK_RELOAD_SECONDS": "0.5"}

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual import grants

me, peers, no_remote = {me!r}, {peers!r}, {no_remote!r}


def account(name, remote=False):
    a = Account(username=name, is_remote_server=remote)
    a.set_password('pw')
    a.save()
    return a


def topic(path):
    parent = None
    for i in range(2, len(path.split('/')) + 1):
        sub = '/'.join(path.split('/')[:i])
        parent = Topic.objects.filter(key=sub.casefold()).first() or \\
            Topic.objects.create(path=sub, parent=parent)
    return parent


def allow(t, right, who):
    grants.grant_to_many(t, right, 'allow', [who])


bob = account('bob')
news = topic('/news')
for sub in ('d1', 'd0', 'dm', 'kill', 'bench'):
    topic('/news/' + sub)
allow(news, 'publish', bob)
allow(news, 'subscribe', bob)
secret = topic('/secret')
allow(secret, 'publish', bob)
for p in peers:
    root = topic('/' + p)
    allow(root, 'subscribe', bob)
for p in peers:
    peer = account('peer_' + p, remote=True)
    if p in no_remote:
        continue
    allow(news, 'remote', peer)
    for q in peers:
        allow(topic('/' + q), 'remote', peer)
"""

LINK = """
from accounts.models import Account
from broker.models import Link

for name, host, port, me in {links!r}:
    Link.objects.create(name=name, host=host, port=port, account='peer_' + me, password='pw',
                        imports='/*', peer_account=Account.objects.get(username='peer_' + name))
"""


@dataclass
class Domain:
    """One broker of the federation: its context, listener and link supervisor."""

    name: str
    context: str
    env: dict[str, str]
    var: Path
    listener: BrokerProcess | None = None
    links: subprocess.Popen | None = None
    links_log: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def host(self) -> str:
        assert self.listener is not None
        return self.listener.host

    @property
    def port(self) -> int:
        assert self.listener is not None
        return self.listener.port

    def shell(self, code: str) -> str:
        return run_manage(self.env, "shell", "--no-imports", "-c", code).stdout

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        """Rows of a read-only query on this domain's database (faster than a manage.py
        shell: the tests poll with it). ``?`` placeholders."""
        url = self.env["DATABASE_URL"]
        if url.startswith("sqlite:///"):
            import sqlite3

            with contextlib.closing(sqlite3.connect(url[len("sqlite:///"):], timeout=30)) as db:
                return list(db.execute(query, params))
        import psycopg

        with psycopg.connect(url) as db:
            return list(db.execute(query.replace("?", "%s"), params))

    def start_listener(self, port: int = 0) -> None:
        args = ("--port", str(port)) if port else ()
        # start_listener passes --port 0 first; a later --port wins (argparse).
        self.listener = start_listener(self.env, self.var, *args, name=f"smqp-{self.name}")

    def start_links(self) -> None:
        self.links_log = self.var / f"links-{self.name}-{uuid.uuid4().hex[:6]}.log"
        self.links = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runlinks"], env=self.env, cwd=ROOT,
            stdout=self.links_log.open("w"), stderr=subprocess.STDOUT)

    def links_text(self) -> str:
        return self.links_log.read_text(errors="replace") if self.links_log else ""

    def link_rows(self) -> dict[str, dict]:
        """Each link's row here: state, stored, dropped, last error, subscribed."""
        out = self.shell(
            "import json\nfrom broker.models import Link\n"
            "print(json.dumps({l.name: {'state': l.state, 'stored': l.stored, "
            "'dropped': l.dropped, 'last_error': l.last_error, 'subscribed': l.subscribed} "
            "for l in Link.objects.all()}))")
        import json

        return json.loads(out.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.links is not None:
            stop_process(self.links)
        if self.listener is not None:
            stop_process(self.listener.proc)


def wait_for(condition, timeout: float = 90.0, what: str = "condition", interval: float = 0.2):
    """Poll ``condition`` until it returns a true value (returned), or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


@contextmanager
def federation(backend: str, base: Path, names: tuple[str, ...] = ("a", "b", "c"),
               no_remote: dict[str, tuple[str, ...]] | None = None,
               hosts: dict[str, str] | None = None,
               listen: dict[str, tuple[str, int]] | None = None) -> Iterator[dict[str, Domain]]:
    """Brokers ``names`` (contexts ``<name>.test``), each linked to every other. On domain
    X, ``no_remote[X]`` lists the peers whose account gets no ``remote`` right there.
    ``hosts``/``listen`` (netns runs): the address each domain's links use for a peer,
    and the host and port each listener binds."""
    no_remote = no_remote or {}
    with ExitStack() as stack:
        domains: dict[str, Domain] = {}
        for name in names:
            var = base / name
            var.mkdir(parents=True, exist_ok=True)
            env = stack.enter_context(fresh_database(backend, var, {
                **FAST_LINKS, "SMQP_SERVER_CONTEXT": f"{name}.test"}))
            peers = [p for p in names if p != name]
            run_manage(env, "shell", "--no-imports", "-c", SETUP.format(
                me=name, peers=peers, no_remote=list(no_remote.get(name, ()))))
            domains[name] = Domain(name, f"{name}.test", env, var)
        for d in domains.values():
            stack.callback(d.stop)
            if listen and d.name in listen:
                d.env = {**d.env, **listen_env(listen[d.name])}
                d.listener = start_listener_at(d, *listen[d.name])
            else:
                d.start_listener()
        for d in domains.values():
            links = [(p, (hosts or {}).get(p, domains[p].host), domains[p].port, d.name)
                     for p in names if p != d.name]
            d.shell(LINK.format(links=links))
            d.start_links()
        yield domains


def listen_env(address: tuple[str, int]) -> dict[str, str]:
    return {"SMQP_HOST": address[0]}


def start_listener_at(d: Domain, host: str, port: int, prefix: list[str] | None = None
                      ) -> BrokerProcess:
    """A listener bound to ``host:port`` (``prefix``: run it through, e.g. ``ip netns
    exec``)."""
    log_path = d.var / f"smqp-{d.name}-{uuid.uuid4().hex[:6]}.log"
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, str(ROOT / "manage.py"), "runsmqp", "--host", host,
         "--port", str(port)], env=d.env, cwd=ROOT, stdout=log_path.open("w"),
        stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        match = re.search(r"SMQP listening on ([\d.]+):(\d+)", log_path.read_text())
        if match:
            return BrokerProcess(match[1], int(match[2]), d.env, proc, d.var, log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"runsmqp did not start:\n{log_path.read_text()}")


def pg_or_sqlite() -> list[str]:
    return ["sqlite", "postgres"] if os.environ.get("SMQP_FED_BOTH") else ["sqlite"]
