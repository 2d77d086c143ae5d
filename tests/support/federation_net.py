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
    stop_process,
)
from tests.support.timing import scaled

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

            with contextlib.closing(sqlite3.connect(url[len("sqlite:///"):],
                                                    timeout=scaled(30))) as db:
                return list(db.execute(query, params))
        import psycopg

        with psycopg.connect(url) as db:
            return list(db.execute(query.replace("?", "%s"), params))

    def start_listener(self, port: int = 0, host: str = "127.0.0.1",
                       prefix: list[str] | None = None, tls: bool = False) -> None:
        """``runsmqp`` on ``host:port`` (0: a free port), run through ``prefix`` if given
        (``ip netns exec NS``); with ``tls``, SMQPS as well (its port in ``extra``)."""
        log_path = self.var / f"smqp-{self.name}-{uuid.uuid4().hex[:6]}.log"
        proc = subprocess.Popen(
            [*(prefix or []), sys.executable, str(ROOT / "manage.py"), "runsmqp", "--host",
             host, "--port", str(port), *(("--tls-port", "0") if tls else ())],
            env=self.env, cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline:
            text = log_path.read_text()
            match = re.search(r"SMQP listening on ([\d.]+):(\d+)", text)
            secure = re.search(r"SMQPS listening on [\d.]+:(\d+)", text)
            if secure:
                self.extra["tls_port"] = int(secure[1])
            if match and (secure or not tls):
                self.listener = BrokerProcess(match[1], int(match[2]), self.env, proc,
                                              self.var, log_path)
                return
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        raise AssertionError(f"runsmqp did not start:\n{log_path.read_text()}")

    def start_links(self, prefix: list[str] | None = None) -> None:
        """``runlinks``, run through ``prefix`` if given."""
        self.links_log = self.var / f"links-{self.name}-{uuid.uuid4().hex[:6]}.log"
        self.links = subprocess.Popen(
            [*(prefix or []), sys.executable, str(ROOT / "manage.py"), "runlinks"],
            env=self.env, cwd=ROOT, stdout=self.links_log.open("w"),
            stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.links is not None:
            stop_process(self.links)
        if self.listener is not None:
            stop_process(self.listener.proc)


def wait_for(condition, timeout: float = 90.0, what: str = "condition", interval: float = 0.2):
    """Poll ``condition`` until it returns a true value (returned), or fail."""
    deadline = time.monotonic() + scaled(timeout)
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
               extra_env: dict[str, str] | None = None) -> Iterator[dict[str, Domain]]:
    """Brokers ``names`` (contexts ``<name>.test``) on localhost, each linked to every
    other. On domain X, ``no_remote[X]`` lists the peers whose account gets no ``remote``
    right there."""
    with prepared(backend, base, names, no_remote, extra_env) as domains:
        for d in domains.values():
            d.start_listener()
        link_all(domains)
        yield domains


@contextmanager
def prepared(backend: str, base: Path, names: tuple[str, ...],
             no_remote: dict[str, tuple[str, ...]] | None = None,
             extra_env: dict[str, str] | None = None) -> Iterator[dict[str, Domain]]:
    """The domains' databases, accounts, topics and rights; nothing started yet (what is
    started later is stopped on the way out)."""
    no_remote = no_remote or {}
    with ExitStack() as stack:
        domains: dict[str, Domain] = {}
        for name in names:
            var = base / name
            var.mkdir(parents=True, exist_ok=True)
            peers = [p for p in names if p != name]
            # The setup made once per test process in a template (fresh_database): a later
            # federation with the same domain on this worker copies it, no process start.
            env = stack.enter_context(fresh_database(backend, var, {
                **FAST_LINKS, **(extra_env or {}), "SMQP_SERVER_CONTEXT": f"{name}.test"},
                setup=SETUP.format(me=name, peers=peers,
                                   no_remote=list(no_remote.get(name, ())))))
            domains[name] = Domain(name, f"{name}.test", env, var)
            stack.callback(domains[name].stop)
        yield domains


def link_all(domains: dict[str, Domain], prefix: dict[str, list[str]] | None = None) -> None:
    """Every domain's links to every other (at the address its listener bound), and its
    link supervisor started (through ``prefix[name]``, e.g. ``ip netns exec NS``)."""
    for d in domains.values():
        links = [(p.name, p.host, p.port, d.name) for p in domains.values() if p is not d]
        d.shell(LINK.format(links=links))
        d.start_links((prefix or {}).get(d.name))
