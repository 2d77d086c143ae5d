"""The ``xmpp`` benchmark: queue throughput of XMPP workers (XEP-0254) against SMQP queue
workers and RabbitMQ's work queue, in the same run.

An isolated broker (``runsmqp``) and Daphne beside it (the XMPP door, as ``runbroker``
serves it) share one database. For each case a fresh queue node gets ``--items`` items
(``--size``-byte payload, published over SMQP before the workers start; the worker account's
durable subscription holds them), then ``--workers`` workers (4) of one account drain it:

- ``xmpp q=1`` / ``xmpp q=16``: XMPP streams subscribed with ``pubsub#queue_requests`` 1 and
  16, each retracting (consuming) every item it is sent;
- ``smqp``: SMQP sessions in queue mode, each answering every NOTIFY with ``310 ACK``;
- ``rabbitmq prefetch=1`` / ``=16``: a durable RabbitMQ queue with as many persistent
  messages, drained by as many consumers with that prefetch, acknowledging each.

The figure is items consumed per second, from the first worker's start to the last item's
consumption (the broker's retract / ACK answer).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from .isolated import ROOT, BrokerSetupError, check_services, isolated_broker
from .stats import environment_info, timestamp, write_results

SETUP = (
    "from accounts.models import Account\n"
    "for name, su in (('root', True), ('worker', False)):\n"
    "    a = Account(username=name, is_superuser=su, is_staff=su)\n"
    "    a.set_password('pw')\n"
    "    a.save()\n"
    "from broker.services import topics as ts\n"
    "from ual.resolution import AccessSnapshot\n"
    "from ual.models import UALEntry\n"
    "ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), '/bench')\n"
    "for right in ('subscribe', 'publish'):\n"
    "    UALEntry.objects.create(topic=ts.find('/bench'), principal_kind='everyone',"
    " right=right)\n"
)
FINAL_LINE = re.compile(rb"^\d{3} ", re.M)
PUBSUB = "http://jabber.org/protocol/pubsub"
EVENT_ITEM = "{http://jabber.org/protocol/pubsub#event}item"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_daphne(env: dict[str, str], var_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = (var_dir / "daphne.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p",
                             str(port), "broker.asgi_server:application"],
                            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"ws://127.0.0.1:{port}/xmpp-websocket"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise BrokerSetupError("daphne did not start")


# ------------------------------------------------------------------ SMQP


class _SMQP:
    """A blocking SMQP client: commands, pipelined publishes, NOTIFY + 310 ACK."""

    def __init__(self, host: str, port: int, user: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        while b"\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        self.buffer = self.buffer.split(b"\r\n", 1)[1]
        self.command(f"LOGIN {user} CLEAR/1.0\r\n".encode())
        assert self.command(f"PASS {user} pw\r\n".encode()).startswith(b"200"), "login"

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        self.buffer += data

    def reply(self) -> bytes:
        while True:
            match = FINAL_LINE.search(self.buffer)
            if match:
                end = self.buffer.find(b"\r\n", match.start())
                if end >= 0:
                    line, self.buffer = self.buffer[match.start():end], self.buffer[end + 2:]
                    return line
            self._fill()

    def command(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        return self.reply()

    def publish_many(self, topic: str, bodies: list[bytes]) -> None:
        for start in range(0, len(bodies), 200):
            chunk = bodies[start:start + 200]
            self.sock.sendall(b"".join(
                b"PUB MESSAGE %s c%d\r\n\r\nContent-Type: application/xml\r\n"
                b"Content-Length: %d\r\n\r\n%s\r\n.\r\n" % (topic.encode(), start + i,
                                                            len(b), b)
                for i, b in enumerate(chunk)))
            for _ in chunk:
                assert self.reply().startswith(b"200"), "publish refused"

    def consume(self, done: Callable[[], bool], count: Callable[[], None]) -> None:
        """Answer every NOTIFY MESSAGE with 310 ACK until ``done()``; an item counts once
        the server's own 310 ACK (the consumption recorded) is read."""
        self.sock.settimeout(0.5)
        while not done():
            if self.buffer.startswith(b"NOTIFY MESSAGE"):
                end = self.buffer.find(b"\r\n.\r\n")
                if end >= 0:
                    self.buffer = self.buffer[end + 5:]
                    self.sock.sendall(b"310 ACK\r\n")
                    continue
            elif b"\r\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\r\n", 1)
                if line == b"310 ACK":
                    count()
                continue
            try:
                self._fill()
            except TimeoutError:
                continue


# ------------------------------------------------------------------ XMPP


class _XMPP:
    """An XMPP stream over a WebSocket (websocket-client), logged in and bound."""

    def __init__(self, url: str, user: str) -> None:
        import websocket

        self.ws = websocket.create_connection(url, subprotocols=["xmpp"], timeout=60)
        self.ids = 0
        framing = "urn:ietf:params:xml:ns:xmpp-framing"
        self.ws.send(f"<open xmlns='{framing}' to='localhost' version='1.0'/>")
        self._until("features")
        auth = base64.b64encode(f"\0{user}\0pw".encode()).decode()
        self.ws.send(f"<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>"
                     f"{auth}</auth>")
        assert self._until("success", "failure").endswith("success"), "XMPP login"
        self.ws.send(f"<open xmlns='{framing}' to='localhost' version='1.0'/>")
        self._until("features")
        self.ws.send("<iq xmlns='jabber:client' type='set' id='b'><bind xmlns='urn:ietf:"
                     "params:xml:ns:xmpp-bind'/></iq>")
        self._until("iq")
        self.bare = f"{user}@localhost"

    def _until(self, *names: str) -> str:
        while True:
            tag = ET.fromstring(self.ws.recv()).tag
            if tag.rsplit("}", 1)[-1] in names:
                return tag

    def iq(self, body: str) -> ET.Element:
        self.ids += 1
        iq_id = f"q{self.ids}"
        self.ws.send(f"<iq xmlns='jabber:client' type='set' id='{iq_id}' "
                     f"to='pubsub.localhost'>{body}</iq>")
        while True:
            element = ET.fromstring(self.ws.recv())
            if element.get("id") == iq_id:
                return element

    def subscribe(self, node: str, requests: int) -> None:
        reply = self.iq(
            f"<pubsub xmlns='{PUBSUB}'><subscribe node='{node}' jid='{self.bare}'/>"
            f"<options><x xmlns='jabber:x:data' type='submit'><field var='pubsub#queue_"
            f"requests'><value>{requests}</value></field></x></options></pubsub>")
        assert reply.get("type") == "result", ET.tostring(reply)

    def consume(self, node: str, done: Callable[[], bool], count: Callable[[], None]) -> None:
        """Retract every item sent (pipelined); an item counts once its retract is
        answered with a result."""
        import websocket

        self.ws.settimeout(0.5)
        while not done():
            try:
                element = ET.fromstring(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if element.tag == "{jabber:client}iq":
                if element.get("type") == "result" and (element.get("id") or "").startswith(
                        "r"):
                    count()
                continue
            item = element.find(f".//{EVENT_ITEM}")
            if item is None:
                continue
            self.ids += 1
            self.ws.send(f"<iq xmlns='jabber:client' type='set' id='r{self.ids}' "
                         f"to='pubsub.localhost'><pubsub xmlns='{PUBSUB}'><retract "
                         f"node='{node}'><item id='{item.get('id')}'/></retract></pubsub></iq>")

    def close(self) -> None:
        self.ws.close()


# ------------------------------------------------------------------ runs


def _drain(workers: int, items: int, make: Callable[[int], Callable]) -> float:
    """Seconds for ``workers`` threads to consume ``items``."""
    consumed = [0]
    lock = threading.Lock()
    finished = threading.Event()

    def count() -> None:
        with lock:
            consumed[0] += 1
            if consumed[0] >= items:
                finished.set()

    start = time.monotonic()  # logins included: each door's own
    runners = [make(i) for i in range(workers)]
    threads = [threading.Thread(target=run, args=(finished.is_set, count), daemon=True)
               for run in runners]
    for thread in threads:
        thread.start()
    if not finished.wait(600):
        raise BrokerSetupError(f"only {consumed[0]} of {items} consumed in 600 s")
    elapsed = time.monotonic() - start
    for thread in threads:
        thread.join(10)
    return elapsed


def _rabbit(items: int, workers: int, prefetch: int, body: bytes) -> float:
    import pika

    params = pika.ConnectionParameters("127.0.0.1", 5672,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    name = f"smqp-bench-xmpp-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/xml")
    for _ in range(items):
        ch.basic_publish("", name, body, props)

    def make(index: int) -> Callable:
        c = pika.BlockingConnection(params)
        channel = c.channel()
        channel.basic_qos(prefetch_count=prefetch)

        def run(done: Callable[[], bool], count: Callable[[], None]) -> None:
            for method, _, _ in channel.consume(name, inactivity_timeout=0.5):
                if done():
                    break
                if method is None:
                    continue
                channel.basic_ack(method.delivery_tag)
                count()
            try:
                channel.cancel()
                c.close()
            except Exception:  # closing after the run: the figure is taken
                pass
        return run

    try:
        return _drain(workers, items, make)
    finally:
        ch.queue_delete(name)
        conn.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="payload bytes per item")
    parser.add_argument("--no-rabbitmq", action="store_true")


def main(args: argparse.Namespace) -> int:
    check_services((args.db,))
    body = b"<job xmlns='urn:bench'>" + b"x" * args.size + b"</job>"
    runs = []

    def record(case: str, seconds: float) -> None:
        rate = args.items / seconds
        runs.append({"case": case, "backend": args.db, "workers": args.workers,
                     "items": args.items, "payload": args.size, "seconds": seconds,
                     "per_second": rate})
        print(f"{case:22} {rate:8.1f} items/s ({args.items} in {seconds:.2f} s)")
        sys.stdout.flush()

    with isolated_broker(args.db, setup=lambda b: b.run_python(SETUP),
                         extra_env={"SMQP_XMPP_PLAIN": "loopback",
                                    "SMQP_DEFAULT_RETRY_TIMEOUT": "120"}) as broker:
        daphne, url = _start_daphne(broker.env, broker.var_dir)
        try:
            root = _SMQP(broker.host, broker.port, "root")
            for case, requests in (("xmpp q=1", 1), ("xmpp q=16", 16), ("smqp", 0)):
                node = f"/bench/q{uuid.uuid4().hex[:6]}"
                assert root.command(f"CREATE TOPIC {node}\r\n".encode()).startswith(b"200")
                broker.run_python(
                    "from topics.models import Topic\n"
                    f"Topic.objects.filter(path='{node}').update(delivery_mode='queue')\n"
                    # A raw update bumps no tree generation: without this the running
                    # listeners keep the node as fan-out (issue 38's q=16 "hang").
                    "from topics import tree; tree.changed()\n")
                if requests:
                    first = _XMPP(url, "worker")
                    first.subscribe(node, requests)
                    first.close()
                else:
                    first_smqp = _SMQP(broker.host, broker.port, "worker")
                    first_smqp.command(f"SUB MESSAGE {node}\r\n".encode())
                    first_smqp.sock.close()
                time.sleep(1.0)  # the sessions above have ended (their locks, none)
                root.publish_many(node, [body] * args.items)

                def make(index: int, node: str = node, requests: int = requests) -> Callable:
                    if requests:
                        worker = _XMPP(url, "worker")
                        worker.subscribe(node, requests)
                        return lambda done, count: worker.consume(node, done, count)
                    smqp = _SMQP(broker.host, broker.port, "worker")
                    smqp.command(f"SUB MESSAGE {node}\r\n".encode())
                    return smqp.consume

                record(case, _drain(args.workers, args.items, make))
        finally:
            daphne.terminate()
            daphne.wait(30)
    if not args.no_rabbitmq:
        for prefetch in (1, 16):
            record(f"rabbitmq prefetch={prefetch}",
                   _rabbit(args.items, args.workers, prefetch, body))
    result = {"benchmark": "xmpp", "when": timestamp(), "environment": environment_info(),
              "cpus": os.cpu_count(), "runs": runs}
    print(f"results: {write_results('xmpp', result)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(argparse.ArgumentParser().parse_args()))
