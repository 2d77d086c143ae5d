"""The ``queue`` benchmark (issue 38): competing consumers draining one queue topic, at every
door of the broker and beside RabbitMQ and NATS JetStream, in the same run.

For each database backend (``--db``) an isolated broker (``runsmqp``) and Daphne beside it
(the XMPP and REST doors) share one database. Each round runs every case once, in alternating
order (reversed on odd rounds, so that a slow drift of the machine's load does not favour one
case). A case publishes ``--items`` (5,000) ``--size``-byte (256) items to a fresh queue topic,
then ``--workers`` (4) workers of one account (a fresh account per case) drain it:

- ``smqp``: SMQP sessions logged in as the account (its subscription exists before the
  items are published); each answers every ``NOTIFY MESSAGE`` with ``310 ACK``; an item
  counts when the server's own ``310 ACK`` answers (the consumption committed). With
  ``--smqp-windows`` above 1 (``smqp w=N``) each session first asks ``SET NOTIFY WINDOW N``
  (profile §9.7; a server without it refuses, and the case says so);
- ``xmpp q=N``: XMPP streams (WebSocket) subscribed with ``pubsub#queue_requests`` N, each
  retracting every item it is sent; an item counts when its retract is answered ``result``;
- ``rest b=N``: REST pull (``max`` N, ``wait_seconds`` 1), then one batch ACK of what it
  got (``POST …/receipts/ack`` with its receipts); an item counts when the answer says it
  was ``consumed``;
- ``rest-each b=N`` (run with ``rest``, or alone): the same pulls, then
  ``POST …/receipts/{r}/ack`` per item; an item counts when its ack is answered ``204``;
- ``rabbitmq p=N``: a durable queue with persistent, confirmed messages; ``basic.qos``
  prefetch N, ``basic.ack`` per delivery (not confirmed by the broker);
- ``nats b=N``: a JetStream work-queue stream (file storage), one durable pull consumer with
  explicit ack shared by the workers, ``fetch(N)``, ``ack()`` per message (not confirmed).

N is each of ``--windows`` (1 and 16). Every case has a time budget (``--budget``): a case
that has not drained its items by then stops and reports what it consumed ("0 consumed in
60 s") and why, when it knows (a stream the server closed, a refused ACK): it never hangs.
The clock runs from the workers' start (connections and logins included, each door's own)
to the last item's consumption. Every body carries its item number: an item consumed twice
is counted as a duplicate (an error).

Figures: items/s per case and round; per case the median and the spread (min-max) over the
rounds, and ratios of the broker's medians to the peers' medians of the same backend's
rounds. The load average is recorded with each round. Results go to
``bench/results/<stamp>-queue.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .drivers import SubscriberFramer
from .isolated import BACKENDS, BrokerEnv, check_services, isolated_broker
from .stats import environment_info, format_table, spread, timestamp, write_results
from .xmpp import _SMQP, _XMPP, EVENT_ITEM, PUBSUB, _start_daphne

NAME = "queue"
PASSWORD = "pw"
ROOT_USER = "root"
DOORS = ("smqp", "xmpp", "rest", "rest-each")
PEERS = ("rabbitmq", "nats")
#: The item number in a body: ``<job xmlns='urn:bench' n='00000042'>xxx…</job>``.
ITEM_NUMBER = re.compile(rb"""n=['"](\d+)['"]""")
AMQP = ("127.0.0.1", 5672, "guest", "guest")
NATS_URL = "nats://127.0.0.1:4222"


# ==================================================================================== cases


@dataclass(frozen=True)
class Case:
    """One way of draining the queue: a door of the broker or a peer, with its window."""

    kind: str  # smqp | xmpp | rest | rest-each | rabbitmq | nats
    window: int = 1

    @property
    def name(self) -> str:
        if self.kind == "smqp" and self.window == 1:
            return "smqp"  # the draft's one message in flight
        letter = {"smqp": "w", "xmpp": "q", "rest": "b", "rest-each": "b", "rabbitmq": "p",
                  "nats": "b"}[self.kind]
        return f"{self.kind} {letter}={self.window}"

    @property
    def is_door(self) -> bool:
        return self.kind in DOORS


def parse_windows(text: str) -> tuple[int, ...]:
    """``"1,16"`` -> ``(1, 16)``; each at least 1, no repeats."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"windows must be distinct integers >= 1: {text!r}")
    return values


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"smqp,rabbitmq"`` -> the kinds, each one of the doors and peers."""
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [k for k in kinds if k not in DOORS + PEERS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown case kind(s) {unknown or text!r}; choose from {', '.join(DOORS + PEERS)}")
    return kinds


def build_cases(kinds: Sequence[str], windows: Sequence[int],
                smqp_windows: Sequence[int] = (1,)) -> list[Case]:
    """The cases of a round: SMQP once per ``smqp_windows`` (1: the draft's one message in
    flight per session; more: ``SET NOTIFY WINDOW``), every other kind once per window.
    ``rest`` (batch ACKs) brings ``rest-each`` (an ACK per item) with it: before and after."""
    if "rest" in kinds and "rest-each" not in kinds:
        kinds = [k for kind in kinds for k in ((kind, "rest-each") if kind == "rest" else (kind,))]
    cases = []
    for kind in kinds:
        chosen = smqp_windows if kind == "smqp" else windows
        cases.extend(Case(kind, w) for w in chosen)
    return cases


def round_order(cases: Sequence[Case], round_index: int) -> list[Case]:
    """Even rounds in the given order, odd rounds reversed."""
    return list(cases) if round_index % 2 == 0 else list(reversed(cases))


def item_body(number: int, size: int) -> bytes:
    """An XML body of exactly ``size`` bytes (when it fits) carrying its item number."""
    head = b"<job xmlns='urn:bench' n='%08d'>" % number
    tail = b"</job>"
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def item_number(data: bytes | str) -> int | None:
    """The item number in a body (or any text holding one), None when there is none."""
    raw = data.encode() if isinstance(data, str) else data
    match = ITEM_NUMBER.search(raw)
    return int(match[1]) if match else None


# =================================================================================== drain


class Tally:
    """What the workers of one case consumed (thread-safe): distinct item numbers,
    duplicates, consumptions without a number, and the errors they met."""

    def __init__(self, items: int) -> None:
        self.items = items
        self.lock = threading.Lock()
        self.seen: set[int] = set()
        self.duplicates = 0
        self.unnumbered = 0
        self.errors: list[str] = []
        self.done = threading.Event()
        self.last = 0.0

    def consumed(self, number: int | None) -> None:
        with self.lock:
            self.last = time.monotonic()
            if number is None:
                self.unnumbered += 1
            elif number in self.seen:
                self.duplicates += 1
            else:
                self.seen.add(number)
            if len(self.seen) + self.unnumbered >= self.items:
                self.done.set()

    def error(self, text: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(text)

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.seen) + self.unnumbered


@dataclass
class Outcome:
    """One case's run: how many items were consumed in how many seconds."""

    case: str
    items: int
    consumed: int
    seconds: float
    complete: bool
    budget: float
    duplicates: int = 0
    #: Consumptions whose body showed no item number (not checked for duplicates).
    unnumbered: int = 0
    errors: list[str] = field(default_factory=list)
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: Why an incomplete case ended, when it is neither its budget nor its workers.
    reason: str = ""

    @property
    def per_second(self) -> float:
        return self.consumed / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        if self.complete:
            text = f"{self.per_second:9.1f} items/s ({self.consumed} in {self.seconds:.2f} s)"
        else:
            why = self.reason or ("budget" if self.seconds >= self.budget
                                  else "every worker stopped")
            text = (f"{self.per_second:9.1f} items/s (only {self.consumed} of {self.items} "
                    f"consumed in {self.seconds:.0f} s: {why})")
        if self.duplicates:
            text += f"; {self.duplicates} CONSUMED TWICE"
        if self.unnumbered:
            text += f"; {self.unnumbered} without an item number (not checked for duplicates)"
        return text


#: A worker: runs until the tally is done or ``stop`` is set; may raise (it is recorded).
Runner = Callable[[Tally, threading.Event], None]


def drain(name: str, items: int, budget: float, runners: Sequence[Runner]) -> Outcome:
    """Run the workers in threads until ``items`` are consumed or ``budget`` seconds pass."""
    tally = Tally(items)
    stop = threading.Event()

    def guarded(index: int, run: Runner) -> None:
        try:
            run(tally, stop)
        except Exception as exc:
            tally.error(f"worker {index}: {type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=guarded, args=(i, run), daemon=True,
                                name=f"bench-queue-{name}-{i}")
               for i, run in enumerate(runners)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    deadline = start + budget
    while not tally.done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline or not any(t.is_alive() for t in threads):
            break  # out of time, or every worker gave up (its error says why)
    complete = tally.done.is_set()
    stop.set()
    elapsed = (tally.last if complete else min(time.monotonic(), deadline)) - start
    for thread in threads:
        thread.join(15)
    return Outcome(name, items, tally.count, elapsed, complete, budget, tally.duplicates,
                   tally.unnumbered, list(tally.errors), os.getloadavg())


# ================================================================================= workers


class AckingSession:
    """The wire logic of an SMQP queue worker, without its socket: :meth:`feed` takes what
    the server sent after the greeting (the login's answers, NOTIFYs, the server's
    ``310 ACK``s, in any interleaving) and returns what to send back. Every NOTIFY MESSAGE is
    answered with ``310 ACK``, also one that arrives before a reply (the minimal client of
    ``bench xmpp`` skipped one there and left its lock to the deadline); an item counts
    when the server's own ``310 ACK`` answers."""

    def __init__(self, tally: Tally, window: int = 1) -> None:
        self.tally = tally
        self.window = window
        self.framer = SubscriberFramer()
        self.finals = 0  # final reply lines: LOGIN's, PASS's, SET's, then refused ACKs
        self.setup = 2 if window == 1 else 3
        self.in_flight: list[int | None] = []  # NOTIFYed, not yet answered, oldest first

    def opening(self, user: str) -> bytes:
        """What to send after the greeting: the login, and the window when it is not 1."""
        lines = f"LOGIN {user} CLEAR/1.0\r\nPASS {user} {PASSWORD}\r\n"
        if self.window != 1:
            lines += f"SET NOTIFY WINDOW {self.window}\r\n"
        return lines.encode()

    def feed(self, data: bytes) -> bytes:
        out = []
        for kind, value in self.framer.feed(data):
            if kind == "message":
                self.in_flight.append(item_number(value))
                out.append(b"310 ACK\r\n")
            elif kind == "ack":
                self.tally.consumed(self.in_flight.pop(0) if self.in_flight else None)
            elif kind == "reply" and value[3:4] != b"-":
                self.finals += 1
                if self.finals == 2 and not value.startswith(b"200"):
                    raise ConnectionError(f"login refused: {value!r}")
                if self.finals == 3 and self.setup == 3 and not value.startswith(b"200"):
                    raise ConnectionError(f"SET NOTIFY WINDOW {self.window} refused: "
                                          f"{value.decode('utf-8', 'replace')}")
                if self.finals > self.setup:  # the answer to a 310 ACK was not 310
                    if self.in_flight:
                        self.in_flight.pop(0)
                    self.tally.error(f"ACK refused: {value.decode('utf-8', 'replace')}")
        return b"".join(out)


def smqp_worker(host: str, port: int, user: str, window: int = 1) -> Runner:
    """An SMQP session of ``user`` (``CLEAR/1.0``) run by :class:`AckingSession`, with
    ``SET NOTIFY WINDOW`` (profile §9.7) when ``window`` is not 1."""

    def run(tally: Tally, stop: threading.Event) -> None:
        sock = socket.create_connection((host, port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            buffer = b""
            while b"\r\n" not in buffer:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("closed before the greeting")
                buffer += chunk
            data = buffer.split(b"\r\n", 1)[1]
            session = AckingSession(tally, window)
            sock.sendall(session.opening(user))
            sock.settimeout(0.2)
            while not stop.is_set():
                answer = session.feed(data)
                if answer:
                    sock.sendall(answer)
                try:
                    data = sock.recv(1 << 18)
                except TimeoutError:
                    data = b""
                    continue
                if not data:
                    raise ConnectionError("closed by the server")
        finally:
            with contextlib.suppress(OSError):
                sock.sendall(b"QUIT\r\n")
            sock.close()

    return run


def xmpp_worker(url: str, user: str, node: str, requests: int) -> Runner:
    """An XMPP stream subscribed with ``queue_requests``; retracts every item it is sent."""

    def run(tally: Tally, stop: threading.Event) -> None:
        import websocket

        worker = _XMPP(url, user)
        try:
            worker.subscribe(node, requests)
            worker.ws.settimeout(0.2)
            retracts: dict[str, int | None] = {}
            while not stop.is_set():
                try:
                    frame = worker.ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                except websocket.WebSocketConnectionClosedException:
                    raise ConnectionError("stream closed by the server") from None
                if not frame:
                    raise ConnectionError("stream closed by the server")
                element = ET.fromstring(frame)
                tag = element.tag.rsplit("}", 1)[-1]
                if tag == "close":
                    raise ConnectionError("stream closed by the server (<close/>)")
                if element.tag == "{jabber:client}iq":
                    iq_id = element.get("id") or ""
                    if iq_id in retracts:
                        number = retracts.pop(iq_id)
                        if element.get("type") == "result":
                            tally.consumed(number)
                        else:
                            tally.error(f"retract refused: {frame[:200]}")
                    continue
                item = element.find(f".//{EVENT_ITEM}")
                if item is None:
                    continue
                worker.ids += 1
                iq_id = f"r{worker.ids}"
                retracts[iq_id] = item_number(ET.tostring(item))
                worker.ws.send(f"<iq xmlns='jabber:client' type='set' id='{iq_id}' "
                               f"to='pubsub.localhost'><pubsub xmlns='{PUBSUB}'><retract "
                               f"node='{node}'><item id='{item.get('id')}'/></retract>"
                               f"</pubsub></iq>")
        finally:
            with contextlib.suppress(Exception):
                worker.close()

    return run


def rest_item_number(message: dict[str, Any]) -> int | None:
    """The item number in a pulled message: its first section's ``text``, or ``base64``
    (the REST form of a section that is not ``text/*``, such as these XML bodies)."""
    for section in message.get("sections", []):
        if "text" in section:
            return item_number(section["text"])
        if "base64" in section:
            return item_number(base64.b64decode(section["base64"]))
    return None


def rest_worker(base: str, token: str, subscription: int, batch: int,
                each: bool = False) -> Runner:
    """Pull up to ``batch`` (long-poll 1 s), ACK them in one request (``each``: one request
    per receipt)."""

    def run(tally: Tally, stop: threading.Event) -> None:
        import httpx

        with httpx.Client(base_url=base, timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            while not stop.is_set():
                reply = client.post(f"/api/v1/subscriptions/{subscription}/pull",
                                    json={"max": batch, "wait_seconds": 1})
                if reply.status_code != 200:
                    tally.error(f"pull: {reply.status_code} {reply.text[:200]}")
                    time.sleep(0.2)
                    continue
                messages = reply.json().get("messages", [])
                if each:
                    for message in messages:
                        ack = client.post(f"/api/v1/receipts/{message['receipt']}/ack")
                        if ack.status_code == 204:
                            tally.consumed(rest_item_number(message))
                        else:
                            tally.error(f"ack: {ack.status_code} {ack.text[:200]}")
                elif messages:
                    acks = client.post("/api/v1/receipts/ack", json={
                        "receipts": [m["receipt"] for m in messages]})
                    if acks.status_code != 200:
                        tally.error(f"batch ack: {acks.status_code} {acks.text[:200]}")
                        continue
                    for message, result in zip(messages, acks.json()["results"], strict=True):
                        if result["outcome"] == "consumed":
                            tally.consumed(rest_item_number(message))
                        else:
                            tally.error(f"ack: {result['outcome']} {result['status']}")

    return run


# =================================================================================== peers


def run_rabbitmq(items: int, size: int, workers: int, prefetch: int,
                 budget: float) -> Outcome:
    """A durable queue, persistent confirmed messages, ``workers`` consumers with
    ``prefetch``, ``basic.ack`` per delivery."""
    import pika

    host, port, user, password = AMQP
    params = pika.ConnectionParameters(host, port, credentials=pika.PlainCredentials(
        user, password), heartbeat=0)
    name = f"smqp-bench-queue-{uuid.uuid4().hex[:8]}"
    admin = pika.BlockingConnection(params)
    channel = admin.channel()
    channel.queue_declare(name, durable=True)
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/xml")
    for number in range(items):
        channel.basic_publish("", name, item_body(number, size), props)

    def worker(tally: Tally, stop: threading.Event) -> None:
        connection = pika.BlockingConnection(params)
        try:
            ch = connection.channel()
            ch.basic_qos(prefetch_count=prefetch)
            for method, _, body in ch.consume(name, inactivity_timeout=0.2):
                if stop.is_set():
                    break
                if method is None:
                    continue
                ch.basic_ack(method.delivery_tag)
                tally.consumed(item_number(body))
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    try:
        return drain(Case("rabbitmq", prefetch).name, items, budget, [worker] * workers)
    finally:
        with contextlib.suppress(Exception):
            channel.queue_delete(name)
            admin.close()


def run_nats(items: int, size: int, workers: int, batch: int, budget: float) -> Outcome:
    """A work-queue stream on file storage, one durable pull consumer with explicit ack
    shared by ``workers`` connections, each fetching ``batch`` and acking each message."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

    tag = uuid.uuid4().hex[:8]
    stream, subject = f"SMQPBENCHQ{tag}", f"smqpbench.queue.{tag}"

    async def prepare() -> None:
        nc = await nats.connect(NATS_URL)
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[subject],
                                retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE)
            await js.add_consumer(stream, ConsumerConfig(
                durable_name="workers", ack_policy=AckPolicy.EXPLICIT, ack_wait=60))
            for start in range(0, items, 256):  # 256 in flight, each confirmed
                acks = [await js.publish_async(subject, item_body(n, size))
                        for n in range(start, min(items, start + 256))]
                await asyncio.gather(*acks)
            info = await js.stream_info(stream)
            if info.state.messages != items:
                raise RuntimeError(f"NATS stream holds {info.state.messages} of {items}")
        finally:
            await nc.close()

    async def delete() -> None:
        nc = await nats.connect(NATS_URL)
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()

    def worker(tally: Tally, stop: threading.Event) -> None:
        async def consume() -> None:
            nc = await nats.connect(NATS_URL)
            try:
                sub = await nc.jetstream().pull_subscribe(subject, durable="workers",
                                                          stream=stream)
                while not stop.is_set():
                    try:
                        messages = await sub.fetch(batch, timeout=0.5)
                    except (TimeoutError, nats.errors.TimeoutError):
                        continue
                    for message in messages:
                        await message.ack()
                        tally.consumed(item_number(message.data))
            finally:
                await nc.close()

        asyncio.run(consume())

    asyncio.run(prepare())
    try:
        return drain(Case("nats", batch).name, items, budget, [worker] * workers)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(delete())


def peer_problem(kind: str) -> str | None:
    """None when the peer answers on its usual port; else why not."""
    host, port = (AMQP[0], AMQP[1]) if kind == "rabbitmq" else ("127.0.0.1", 4222)
    try:
        with socket.create_connection((host, port), timeout=3):
            return None
    except OSError as exc:
        return f"{kind} at {host}:{port}: {exc}"


# ================================================================================== broker

SETUP = r'''
import json
from accounts.models import Account
from api.tokens import create_token
from broker.models import Subscription
from broker.services import topics as ts
from topics import tree
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import AccessSnapshot

cfg = json.loads(CONFIG)
root = Account(username=cfg["root"], is_superuser=True, is_staff=True)
root.set_password(cfg["password"])
root.save()
snapshot = AccessSnapshot(root)
ts.create_topic(snapshot, "/bench")
for right in ("subscribe", "publish"):
    UALEntry.objects.create(topic=ts.find("/bench"), principal_kind="everyone", right=right)
tokens = {}
for slot, kind in cfg["slots"].items():
    account = Account(username=f"w{slot}")
    account.set_password(cfg["password"])
    account.save()
    path = f"/bench/q{slot}"
    ts.create_topic(snapshot, path)
    Topic.objects.filter(path=path).update(delivery_mode="queue")
    if kind != "xmpp":  # XMPP workers subscribe themselves, with their queue_requests
        Subscription.objects.create(account=account, resource="MESSAGE", pattern=path)
    if kind.startswith("rest"):
        tokens[slot] = create_token(account, "bench", None)[1]
# A raw update bumps no tree generation: running processes must hear of the queue mode.
tree.changed()
print(json.dumps(tokens))
'''


@dataclass
class Slot:
    """A door case's fresh account (``w<n>``) and queue topic (``/bench/q<n>``)."""

    index: int
    case: Case
    token: str = ""

    @property
    def user(self) -> str:
        return f"w{self.index}"

    @property
    def topic(self) -> str:
        return f"/bench/q{self.index}"


def seed(broker: BrokerEnv, slots: list[Slot]) -> None:
    config = json.dumps({"root": ROOT_USER, "password": PASSWORD,
                         "slots": {str(s.index): s.case.kind for s in slots}})
    out = broker.run_python(f"CONFIG = {config!r}\n{SETUP}")
    tokens = json.loads(out.strip().splitlines()[-1])
    for slot in slots:
        slot.token = tokens.get(str(slot.index), "")


def run_door(slot: Slot, args: argparse.Namespace, host: str, port: int, ws_url: str,
             http_url: str, database_url: str = "") -> Outcome:
    """Publish the items to the slot's topic, then drain it at the case's door (with
    ``--analyze``, PostgreSQL's statistics brought up to date in between)."""
    case = slot.case
    if case.kind == "xmpp":  # the account's subscription, before the items exist
        first = _XMPP(ws_url, slot.user)
        first.subscribe(slot.topic, case.window)
        first.close()
        time.sleep(0.5)
    root = _SMQP(host, port, ROOT_USER)
    try:
        root.publish_many(slot.topic, [item_body(n, args.size) for n in range(args.items)])
    finally:
        root.sock.close()
    if args.analyze and database_url.startswith("postgres"):
        analyze(database_url)
    if case.kind == "smqp":
        runners = [smqp_worker(host, port, slot.user, case.window)
                   for _ in range(args.workers)]
    elif case.kind == "xmpp":
        runners = [xmpp_worker(ws_url, slot.user, slot.topic, case.window)
                   for _ in range(args.workers)]
    else:
        import httpx

        subs = httpx.get(f"{http_url}/api/v1/subscriptions/", timeout=30, headers={
            "Authorization": f"Bearer {slot.token}"}).json()["results"]
        sub = next(s["id"] for s in subs if s["pattern"] == slot.topic)
        runners = [rest_worker(http_url, slot.token, sub, case.window,
                               each=case.kind == "rest-each") for _ in range(args.workers)]
    return drain(case.name, args.items, args.budget, runners)


def analyze(database_url: str) -> None:
    """``ANALYZE``: what autovacuum does on a server where it runs (the test server here has
    it off, and a fresh database then has no statistics: PostgreSQL plans the pull's join
    as for empty tables, a nested loop over the topic's messages for each delivery)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def run_peer(case: Case, args: argparse.Namespace) -> Outcome:
    if case.kind == "rabbitmq":
        return run_rabbitmq(args.items, args.size, args.workers, case.window, args.budget)
    return run_nats(args.items, args.size, args.workers, case.window, args.budget)


# ================================================================================ summary


def summarize(outcomes: Sequence[Outcome], cases: Sequence[Case]) -> list[dict[str, Any]]:
    """Per case: median, min and max items/s over its rounds, rounds complete."""
    rows = []
    for case in cases:
        mine = [o for o in outcomes if o.case == case.name]
        if not mine:
            continue
        median, low, high = spread([o.per_second for o in mine])
        rows.append({"case": case.name, "door": case.is_door, "rounds": len(mine),
                     "complete": sum(o.complete for o in mine), "median": median,
                     "min": low, "max": high,
                     "duplicates": sum(o.duplicates for o in mine)})
    return rows


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each door case's median over each peer case's median (> 1: faster than the peer)."""
    peers = [r for r in rows if not r["door"] and r["median"] > 0]
    return [{"case": r["case"], **{p["case"]: r["median"] / p["median"] for p in peers}}
            for r in rows if r["door"]]


def print_summary(backend: str, rows: Sequence[dict[str, Any]],
                  ratio_rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n[{backend}] items/s over the rounds (median, min-max)")
    print(format_table(
        ["case", "median", "min", "max", "rounds complete", "consumed twice"],
        [[r["case"], r["median"], r["min"], r["max"], f"{r['complete']}/{r['rounds']}",
          r["duplicates"]] for r in rows]))
    peers = [k for k in ratio_rows[0] if k != "case"] if ratio_rows else []
    if peers:
        print(f"\n[{backend}] broker median / peer median (> 1: faster than the peer)")
        print(format_table(["case", *peers],
                           [[r["case"], *(f"{r[p]:.3g}" for p in peers)] for r in ratio_rows]))


# ==================================================================================== CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``queue`` benchmark."""
    parser.add_argument("--db", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--items", type=int, default=5000, help="items per case (5000)")
    parser.add_argument("--size", type=int, default=256, help="bytes per item (256)")
    parser.add_argument("--workers", type=int, default=4, help="workers per case (4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per backend (3)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds a case may take before it stops and reports what it "
                             "consumed (60)")
    parser.add_argument("--windows", type=parse_windows, default=(1, 16),
                        help="XMPP queue_requests / REST pull max / RabbitMQ prefetch / NATS "
                             "pull batch values (1,16)")
    parser.add_argument("--smqp-windows", type=parse_windows, default=(1,),
                        help="SMQP delivery windows (1: the draft; more: SET NOTIFY WINDOW n, "
                             "profile 9.7, reported as refused by a server without it)")
    parser.add_argument("--cases", type=parse_kinds, default=DOORS + PEERS,
                        help=f"which kinds to run ({','.join(DOORS + PEERS)})")
    parser.add_argument("--analyze", action="store_true",
                        help="PostgreSQL: ANALYZE after publishing each door case's items "
                             "(as autovacuum would; off on the test server)")
    parser.add_argument("--no-json", action="store_true", help="do not write a results file")


def main(args: argparse.Namespace) -> int:
    if args.items < 1 or args.workers < 1 or args.rounds < 1 or args.budget <= 0:
        raise SystemExit("--items, --workers, --rounds must be >= 1 and --budget > 0")
    backends = BACKENDS if args.db == "both" else (args.db,)
    check_services(backends)
    cases = build_cases(args.cases, args.windows, args.smqp_windows)
    skipped: dict[str, str] = {}
    for kind in PEERS:
        problem = peer_problem(kind) if kind in args.cases else None
        if problem:
            skipped[kind] = problem
            print(f"[{kind}] skipped: {problem}")
    cases = [c for c in cases if c.kind not in skipped]
    stamp = timestamp()
    record: dict[str, Any] = {"benchmark": NAME, "timestamp": stamp,
                              "args": {k: v for k, v in vars(args).items() if k != "func"},
                              "environment": environment_info(), "skipped": skipped,
                              "backends": {}}
    failed = False
    for backend in backends:
        door_cases = [c for c in cases if c.is_door]
        slots = [Slot(i, case) for i, case in enumerate(door_cases * args.rounds)]
        pending = {c: [s for s in slots if s.case == c] for c in door_cases}
        outcomes: list[Outcome] = []
        print(f"[{backend}] preparing an isolated broker and Daphne ...", flush=True)
        with isolated_broker(backend, setup=lambda b, slots=slots: seed(b, slots),
                             extra_env={"SMQP_XMPP_PLAIN": "loopback",
                                        "SMQP_DEFAULT_RETRY_TIMEOUT": "60"}) as broker:
            daphne, ws_url = _start_daphne(broker.env, broker.var_dir)
            http_url = ws_url.replace("ws://", "http://").rsplit("/", 1)[0]
            try:
                for round_index in range(args.rounds):
                    print(f"[{backend}] round {round_index + 1}/{args.rounds} (load "
                          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
                    for case in round_order(cases, round_index):
                        started = time.monotonic()
                        try:
                            if case.is_door:
                                outcome = run_door(pending[case].pop(0), args, broker.host,
                                                   broker.port, ws_url, http_url,
                                                   broker.database_url)
                            else:
                                outcome = run_peer(case, args)
                        except Exception as exc:  # publishing the items, or setting up
                            outcome = Outcome(case.name, args.items, 0,
                                              time.monotonic() - started, False, args.budget,
                                              errors=[f"before the drain: "
                                                      f"{type(exc).__name__}: {exc}"[:300]],
                                              load=os.getloadavg(), reason="setup failed")
                        outcomes.append(outcome)
                        failed |= bool(outcome.duplicates)
                        print(f"  {case.name:16} {outcome.describe()}", flush=True)
                        for error in dict.fromkeys(outcome.errors):
                            print(f"      {error}")
            finally:
                daphne.terminate()
                daphne.wait(30)
        rows = summarize(outcomes, cases)
        ratio_rows = ratios(rows)
        print_summary(backend, rows, ratio_rows)
        record["backends"][backend] = {
            "runs": [{**asdict(o), "per_second": o.per_second} for o in outcomes],
            "summary": rows, "ratios": ratio_rows,
            "server_log_problems": broker.log_problems[:20]}
    if not args.no_json:
        print(f"\nresults: {write_results(NAME, record, stamp=stamp)}")
    sys.stdout.flush()
    return 1 if failed else 0
