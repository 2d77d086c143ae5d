"""The ``federation`` benchmark: forwarded messages per second over one link, and
publish→remote-notify latency, beside the local publish→notify figures of the same run.

Two isolated brokers, A (``a.test``) and B (``b.test``), each a listener on a database of its
own; B runs ``manage.py runlinks`` with one link, ``a``, to A (B's subscriber wants
``/a/news/fed``, so the link subscribes on A to ``/news/fed``). ``bob`` publishes on A one
``PUB MESSAGE`` at a time (each waits for its ``200``), with ``Depth: 1`` and the send time
in an ``X-Sent`` header. A subscriber session ACKs every NOTIFY as it comes:

- local: the subscriber on A, topic ``/news/local`` (one hop, A's own dispatcher);
- federated: the subscriber on B, topic ``/a/news/fed`` (A → link → B's store → B's
  dispatcher).

Two phases each: ``burst`` (``--messages`` published as fast as the publisher can; the rate
is messages received per second from the first publish to the last NOTIFY) and ``paced``
(``--paced`` messages at ``--rate`` per second: latency without a queue in front of it,
p50/p99). The machine is whatever runs it (shared, loaded): the figures say so.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from broker.smqp import commands as c
from broker.smqp.client import ClientConnection, NotifyMessage, ServerAck
from broker.smqp.connection import CLOSED, NEED_DATA
from broker.smqp.message import DataSection, Message
from broker.smqp.replies import Reply

from .isolated import ROOT, BrokerEnv, BrokerSetupError, check_services, isolated_broker
from .stats import environment_info, percentile, timestamp, write_results

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual import grants

def account(name, remote=False):
    a = Account(username=name, is_remote_server=remote)
    a.set_password('pw')
    a.save()
    return a

bob = account('bob')
if {side!r} == 'a':
    peer = account('peer_b', remote=True)
    news = Topic.objects.create(path='/news')
    for sub in ('local', 'fed'):
        Topic.objects.create(path='/news/' + sub, parent=news)
    grants.grant_to_many(news, 'publish', 'allow', [bob])
    grants.grant_to_many(news, 'subscribe', 'allow', [bob])
    grants.grant_to_many(news, 'remote', 'allow', [peer])
else:
    root = Topic.objects.create(path='/a')
    grants.grant_to_many(root, 'subscribe', 'allow', [bob])
"""

LINK = """
from broker.models import Link
Link.objects.create(name='a', host={host!r}, port={port}, account='peer_b', password='pw',
                    imports='/news/*')
"""


class Client:
    """A blocking SMQP client on the project's sans-IO codec."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = ClientConnection()
        self._next()  # the greeting
        self.command("LOGIN bob CLEAR/1.0")
        if self.command("PASS bob pw").code != 200:
            raise BrokerSetupError("bob cannot log in")

    def _next(self):
        while True:
            event = self.conn.next_event()
            if event is NEED_DATA:
                self.conn.receive_data(self.sock.recv(1 << 20))
                continue
            if event is CLOSED:
                raise ConnectionError("the broker closed the connection")
            return event

    def command(self, line: str) -> Reply:
        self.sock.sendall(line.encode() + b"\r\n")
        while True:
            event = self._next()
            if isinstance(event, Reply):
                return event

    def publish(self, topic: str, cmuid: str) -> None:
        msg = Message([("Depth", "1"), ("X-Sent", str(time.time_ns()))],
                      [DataSection([("Content-Type", "text/plain")], b"x" * 64)])
        self.sock.sendall(c.serialize_command(c.Publish("MESSAGE", topic, cmuid, msg)))
        while True:
            event = self._next()
            if isinstance(event, Reply):
                if event.code != 200:
                    raise BrokerSetupError(f"publish refused: {event}")
                return

    def receive(self) -> NotifyMessage:
        """The next NOTIFY MESSAGE, ACKed (its 310 ACK read back)."""
        while True:
            event = self._next()
            if isinstance(event, NotifyMessage):
                break
        self.sock.sendall(b"310 ACK\r\n")
        while not isinstance(self._next(), ServerAck):
            pass
        return event


def _phase(publisher: Client, subscriber: Client, topic: str, count: int,
           rate: float | None) -> dict:
    """Publish ``count`` (at ``rate``/s, or as fast as possible); the subscriber thread
    times each NOTIFY against its X-Sent."""
    latencies: list[float] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in range(count):
                msg = subscriber.receive()
                now = time.time_ns()
                latencies.append((now - int(msg.message.get("X-Sent") or now)) / 1e6)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    start = time.monotonic()
    for i in range(count):
        if rate:
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        publisher.publish(topic, f"m{i}")
    published = time.monotonic()
    if not done.wait(600):
        raise BrokerSetupError(f"only {len(latencies)} of {count} arrived in 600 s")
    if errors:
        raise errors[0]
    elapsed = time.monotonic() - start
    ordered = sorted(latencies)
    return {"messages": count, "seconds": elapsed, "per_second": count / elapsed,
            "publish_per_second": count / (published - start),
            "p50_ms": percentile(ordered, 50), "p99_ms": percentile(ordered, 99),
            "max_ms": ordered[-1]}


@contextmanager
def _two_brokers(backend: str) -> Iterator[tuple[BrokerEnv, BrokerEnv, object]]:
    import subprocess

    with ExitStack() as stack:
        a = stack.enter_context(isolated_broker(
            backend, setup=lambda b: b.run_python(SETUP.format(side="a")),
            extra_env={"SMQP_SERVER_CONTEXT": "a.test"}, log_name="federation-a"))
        b = stack.enter_context(isolated_broker(
            backend, setup=lambda b: b.run_python(SETUP.format(side="b")),
            extra_env={"SMQP_SERVER_CONTEXT": "b.test", "SMQP_LINK_BACKOFF_MAX": "1",
                       "SMQP_LINK_RELOAD_SECONDS": "0.5"}, log_name="federation-b"))
        b.run_python(LINK.format(host=a.host, port=a.port))
        log = (b.var_dir / "runlinks.log").open("wb")
        links = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runlinks"],
                                 env=b.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        stack.callback(lambda: (links.terminate(), links.wait(30)))
        yield a, b, links


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="postgres")
    parser.add_argument("--messages", type=int, default=1000, help="burst phase")
    parser.add_argument("--paced", type=int, default=200, help="paced phase")
    parser.add_argument("--rate", type=float, default=20.0, help="paced phase, msgs/s")


def main(args: argparse.Namespace) -> int:
    backends = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    check_services(backends)
    runs = []
    for backend in backends:
        with _two_brokers(backend) as (a, b, _links):
            publisher = Client(a.host, a.port)
            local = Client(a.host, a.port)
            assert local.command("SUB MESSAGE /news/local").code == 200
            remote = Client(b.host, b.port)
            deadline = time.monotonic() + 120
            while remote.command("SUB MESSAGE /a/news/fed").code != 200:
                if time.monotonic() > deadline:
                    raise BrokerSetupError("B cannot subscribe to /a/news/fed")
                time.sleep(0.5)
            # Until the link subscribed on A for B's subscriber: one message gets through.
            publisher.publish("/news/fed", "warmup")
            remote.receive()
            publisher.publish("/news/local", "warmup")
            local.receive()
            for phase, count, rate in (("burst", args.messages, None),
                                       ("paced", args.paced, args.rate)):
                for path, name, sub in (("/news/local", "local", local),
                                        ("/news/fed", "federated", remote)):
                    result = _phase(publisher, sub, path, count, rate)
                    result.update(backend=backend, phase=phase, path=name)
                    runs.append(result)
                    print(f"{backend:8} {phase:5} {name:9}: {result['per_second']:8.1f} msgs/s "
                          f"received (published {result['publish_per_second']:.1f}/s), "
                          f"latency p50 {result['p50_ms']:.1f} ms, p99 "
                          f"{result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms")
                    sys.stdout.flush()
    record = {"benchmark": "federation", "when": timestamp(), "environment": environment_info(),
              "runs": runs}
    path = write_results("federation", record)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(argparse.ArgumentParser().parse_args()))
