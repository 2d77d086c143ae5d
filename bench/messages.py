"""The ``messages`` benchmark: publish / end-to-end throughput and latency, SMQP beside
RabbitMQ, NATS JetStream and (a reference) Mosquitto.

Scenarios (issue 4), each with ``--size`` byte bodies (256 by default):

``publish``
    ``--publishers`` (4) concurrent publishers, no subscriber. Each keeps ``--window`` (64)
    publishes in flight and counts one done when the broker confirms it (SMQP:
    ``200 <cmuid> <smuid>``, sent after the commit; RabbitMQ: a publisher confirm).
    Figure: confirmed messages per second over the measured window.
``e2e``
    The same publishers and one subscriber on the same topic / queue, which receives every
    message and acknowledges it (SMQP ``310 ACK`` and waits for the server's ``310 ACK``;
    RabbitMQ ``prefetch_count=1`` + ``basic.ack``: one unacknowledged message per consumer).
    Figure: messages delivered to the subscriber per second. The publishers hold back while
    more than ``--max-backlog`` messages are published but not yet delivered, so the figure
    is the sustainable rate rather than the subscriber's rate under an ever-growing queue,
    and every message can be checked: each body carries (publisher, sequence number), and
    every confirmed message must arrive exactly once.
``latency``
    One publisher at a steady ``--rate`` (1,000/s; a monotonic schedule, not sleeps that
    drift) and one subscriber. Latency = the subscriber's receive time of the delivery minus
    the publisher's write time, both ``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for
    all processes of the machine), the latter carried in the body. Figures: p50 / p95 / p99
    / max over the measured window, and the rate achieved.

Before each scenario, the writes the one before left are finished (:func:`settle`: a
PostgreSQL ``CHECKPOINT``, then ``sync``), so that each measures its own work only.

Every scenario runs ``--warmup`` (1 s) + ``--seconds`` (10 s). SMQP runs against an isolated
broker per database backend (:mod:`bench.isolated`), seeded with accounts ``benchpub0..``
(publish right on ``/bench``), ``benchsub`` (subscribe right) and a fresh topic per scenario
(``/bench/publish``, ``/bench/e2e``, ``/bench/latency``). RabbitMQ (``--rabbitmq``, on by
default) gets a fresh durable queue per scenario on the default exchange, persistent
messages, deleted afterwards.

Layout (``--layout``): ``process`` (default) runs every publisher and the subscriber in an OS
process of its own; ``single`` runs them all as asyncio tasks of one process. The CPU of the
load generator is measured (``/proc``) and reported with the server's (SMQP: the listener
process, plus the PostgreSQL backends and WAL writer, plus Redis; RabbitMQ: ``beam.smp``) and
the whole machine's, all in percent of one core.

The load generators run on uvloop (``--client-loop``, for both brokers alike), so that each
publisher and the subscriber is a smaller part of every round trip: with the standard
library's loop, a bare ping-pong between two processes costs twice as much as with uvloop on
this machine.

SMQP's subscriber runs with each ``--smqp-window`` (1 and 64): ``SET NOTIFY WINDOW n``
(profile §9.7) lets n NOTIFY MESSAGEs go before their ACKs, as RabbitMQ's prefetch does;
``smqp-<db>-w64`` runs ``e2e`` and ``latency`` only (publishing does not depend on it).

Peers (each when it answers on its usual port; ``--no-rabbitmq``, ``--no-nats``,
``--no-mosquitto`` leave one out), with the SMQP semantics as far as each has them:

``rabbitmq-p1`` / ``rabbitmq-p64``
    a durable queue, persistent messages, publisher confirms; the subscriber's
    ``prefetch_count`` 1 (the draft's one unacknowledged message) and 64
    (``--rabbitmq-prefetch``). Publishing does not depend on the prefetch: the second one
    runs ``e2e`` and ``latency`` only.
``nats-b1`` / ``nats-b64``
    NATS JetStream (``--nats-port`` 4222): a work-queue stream on file storage, publishes
    confirmed by the stream's PubAck, one durable pull consumer with explicit ack fetching
    batches of 1 and 64 (``--nats-batch``), acking each message.
``mosquitto-qos1``
    MQTT QoS 1 on a Mosquitto of the benchmark's own (its own port and configuration: the
    system one drops messages at its default queue limit of 1,000 per client), a reference
    only, because its semantics differ: a PUBACK means the broker holds the message in
    memory, not on disk (no fsync per message; persistence is a periodic snapshot at best);
    there is no queue: a message reaches only the sessions subscribed when it is published,
    and the subscriber's PUBACK is sent by the client library when the message callback
    returns; up to 20 messages (Mosquitto's ``max_inflight_messages``) are sent to the
    subscriber before its PUBACKs, a window of 20 rather than 1.

Ratios: every SMQP run over every peer's run of the same scenario (throughput: > 1 is
faster; latency: < 1 is lower).

Errors (any exits 1): publishes not confirmed (non-200 / nack), missing, duplicate or unknown
deliveries, refused ACKs, a stored-message count that differs from what was confirmed, client
failures (lost connection, stall: no confirm / delivery for 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import re
import struct
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .client import SMQPClient
from .drivers import (
    REPLY_TIMEOUT,
    BrokerSpec,
    make_publisher,
    make_subscriber,
    nats_check,
    nats_count_and_delete,
    nats_declare,
    rabbit_check,
    rabbit_count_and_delete,
    rabbit_declare,
)
from .isolated import (
    BACKENDS,
    BrokerEnv,
    BrokerSetupError,
    RunningBroker,
    check_services,
    isolated_broker,
    pg_checkpoint,
)
from .procstat import CpuProbe, find_pids, postgres_backend_pids, rabbitmq_pids, redis_pids
from .profiling import PySpy, format_summary, summarize_collapsed
from .queue_drain import parse_windows
from .stats import RESULTS_DIR, environment_info, format_table, percentile, timestamp, write_results

NAME = "messages"
SCENARIOS = ("publish", "e2e", "latency")
PASSWORD = "pw"
PUB_PREFIX = "benchpub"
SUB_USER = "benchsub"
ROOT_USER = "benchroot"
TOPIC_ROOT = "/bench"
#: Body prefix: publisher index, sequence number, perf_counter_ns at the write.
HEADER = struct.Struct("<IIq")
#: Issue 4's targets on the 2-core machine (shown beside the figures, never a pass/fail).
TARGETS = {"publish": ("msgs/s", 10_000.0), "e2e": ("msgs/s", 5_000.0),
           "latency": ("p99 ms", 20.0)}
STALL_SECONDS = REPLY_TIMEOUT
#: e2e: how often a publisher held back by --max-backlog looks again (it cannot be woken
#: across processes; with a backlog of hundreds this pause never starves the subscriber).
BACKLOG_POLL = 0.005


def topic_for(scenario: str) -> str:
    return f"{TOPIC_ROOT}/{scenario}"


# ==================================================================================== plan


@dataclass(frozen=True)
class Plan:
    """One scenario's parameters, the same for every broker (picklable)."""

    scenario: str
    publishers: int
    size: int
    window: int
    seconds: float
    warmup: float
    messages: int | None
    rate: float
    max_backlog: int
    drain_timeout: float
    client_loop: str = "uvloop"

    @property
    def count_mode(self) -> bool:
        """``--messages N``: send N messages (publish, e2e) instead of running for a time."""
        return self.messages is not None and self.scenario != "latency"

    @property
    def publisher_count(self) -> int:
        return 1 if self.scenario == "latency" else self.publishers

    @property
    def has_subscriber(self) -> bool:
        return self.scenario in ("e2e", "latency")

    def quota(self, index: int) -> int | None:
        """Messages publisher ``index`` sends in count mode (None: until the window ends)."""
        if not self.count_mode:
            return None
        assert self.messages is not None
        base, extra = divmod(self.messages, self.publisher_count)
        return base + (1 if index < extra else 0)


@dataclass(frozen=True)
class Window:
    """Perf-counter seconds: when load starts, and the measured window [start, end)."""

    t0: float
    start: float
    end: float

    @classmethod
    def of(cls, plan: Plan, t0: float) -> Window:
        if plan.count_mode:
            return cls(t0, t0, math.inf)
        start = t0 + plan.warmup
        return cls(t0, start, start + plan.seconds)

    @property
    def start_ns(self) -> int:
        return int(self.start * 1e9)

    @property
    def end_ns(self) -> float:
        return self.end * 1e9


@dataclass(frozen=True)
class Role:
    """One publisher (``index``) or the subscriber, as a worker process runs it."""

    kind: str  # "publisher" | "subscriber"
    index: int
    spec: BrokerSpec
    plan: Plan

    @property
    def key(self) -> str:
        return f"{self.kind}{self.index}" if self.kind == "publisher" else self.kind


class Shared:
    """State shared by the coordinator and the worker processes (created before they start).

    ``sent`` has one slot per publisher (each writes its own: no lock needed); ``received``
    is the subscriber's count of distinct deliveries; ``expected`` is set by the coordinator
    once every publisher finished (the number of confirmed messages the subscriber must
    get), -1 until then.
    """

    def __init__(self, ctx: Any, publishers: int) -> None:
        self.go = ctx.Event()
        self.abort = ctx.Value("b", 0, lock=False)
        self.t0 = ctx.Value("d", 0.0, lock=False)
        self.sent = ctx.Array("q", max(1, publishers), lock=False)
        self.received = ctx.Value("q", 0, lock=False)
        self.expected = ctx.Value("q", -1, lock=False)


# ================================================================================== roles


def make_body(index: int, seq: int, size: int, padding: bytes) -> tuple[int, bytes]:
    """(timestamp ns, body): the header with the current time, padded to ``size`` bytes."""
    now = time.perf_counter_ns()
    return now, HEADER.pack(index, seq, now) + padding


@dataclass
class PublisherResult:
    """What one publisher measured (sent to the coordinator as a dict)."""

    index: int
    sent: int = 0
    confirmed: int = 0
    failed: int = 0
    failed_tokens: list[int] = field(default_factory=list)
    failed_samples: list[str] = field(default_factory=list)
    sent_in_window: int = 0
    confirmed_in_window: int = 0
    first_confirm: float | None = None
    last_confirm: float | None = None
    confirm_latencies_ms: list[float] = field(default_factory=list)
    max_lateness_ms: float = 0.0
    backlog_waits: int = 0
    failure: str | None = None


async def run_publisher(role: Role, shared: Shared, window: Window,
                        publisher: Any) -> PublisherResult:
    """Publish with at most ``plan.window`` unconfirmed messages until the window ends (or
    the quota is sent), then wait for the last confirms."""
    plan = role.plan
    res = PublisherResult(role.index)
    inflight: dict[int, int] = {}
    wake = asyncio.Event()
    start_ns, end_ns = window.start_ns, window.end_ns
    padding = bytes(plan.size - HEADER.size)
    quota = plan.quota(role.index)
    backlog_cap = plan.max_backlog if plan.scenario == "e2e" and plan.max_backlog > 0 else 0
    last_progress = time.perf_counter()

    def on_confirm(token: int, ok: bool, detail: str) -> None:
        nonlocal last_progress
        sent_ns = inflight.pop(token, None)
        now_ns = time.perf_counter_ns()
        last_progress = now_ns / 1e9
        if sent_ns is None:
            res.failed += 1
            if len(res.failed_samples) < 5:
                res.failed_samples.append(f"confirm for unknown token {token}")
        elif ok:
            res.confirmed += 1
            if start_ns <= now_ns < end_ns:
                res.confirmed_in_window += 1
                res.confirm_latencies_ms.append((now_ns - sent_ns) / 1e6)
            seconds = now_ns / 1e9
            if res.first_confirm is None:
                res.first_confirm = seconds
            res.last_confirm = seconds
        else:
            res.failed += 1
            res.failed_tokens.append(token)
            if len(res.failed_samples) < 5:
                res.failed_samples.append(detail)
        wake.set()

    publisher.on_confirm = on_confirm

    def send(seq: int) -> None:
        ts, body = make_body(role.index, seq, plan.size, padding)
        inflight[seq] = ts
        publisher.publish(seq, body)
        if start_ns <= ts < end_ns:
            res.sent_in_window += 1

    async def wait_for_confirm(timeout: float) -> None:
        if wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await wake.wait()

    def stalled() -> bool:
        if inflight and time.perf_counter() - last_progress > STALL_SECONDS:
            res.failure = (f"stall: {len(inflight)} publishes unconfirmed for "
                           f"{STALL_SECONDS:g} s")
            return True
        return False

    seq = 0
    try:
        if plan.scenario == "latency":
            interval = 1.0 / plan.rate
            while not shared.abort.value and publisher.failure is None:
                target = window.t0 + seq * interval
                if target >= window.end:
                    break
                delay = target - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    res.max_lateness_ms = max(res.max_lateness_ms, -delay * 1000)
                while len(inflight) >= plan.window and publisher.failure is None:
                    wake.clear()
                    await wait_for_confirm(0.05)
                    if stalled():
                        break
                if res.failure:
                    break
                send(seq)
                seq += 1
                shared.sent[role.index] = seq
                await publisher.flush()
        else:
            while not shared.abort.value and publisher.failure is None:
                now = time.perf_counter()
                if now >= window.end or (quota is not None and seq >= quota):
                    break
                wake.clear()
                room = plan.window - len(inflight)
                if quota is not None:
                    room = min(room, quota - seq)
                blocked = False
                if backlog_cap and room > 0:
                    backlog = sum(shared.sent) - shared.received.value
                    if backlog + room > backlog_cap:
                        room = max(0, backlog_cap - backlog)
                        blocked = room == 0
                if room > 0:
                    for _ in range(room):
                        send(seq)
                        seq += 1
                    shared.sent[role.index] = seq
                    await publisher.flush()
                if blocked:
                    res.backlog_waits += 1
                    await wait_for_confirm(BACKLOG_POLL)
                else:
                    await wait_for_confirm(min(1.0, max(0.001, window.end - now)))
                if stalled():
                    break
        # The last confirms.
        while inflight and publisher.failure is None and not res.failure:
            wake.clear()
            await wait_for_confirm(1.0)
            stalled()
    except Exception as exc:
        res.failure = f"{type(exc).__name__}: {exc}"
    if publisher.failure is not None and res.failure is None:
        res.failure = f"connection: {publisher.failure!r}"
    if inflight and res.failure is None:
        res.failure = f"{len(inflight)} publishes never confirmed"
    res.sent = seq
    return res


@dataclass
class SubscriberResult:
    """What the subscriber measured (sent to the coordinator as a dict)."""

    received: int = 0
    unique: int = 0
    duplicates: int = 0
    unknown: int = 0
    bad_size: int = 0
    in_window: int = 0
    first_receive: float | None = None
    last_receive: float | None = None
    latencies_ns: list[int] = field(default_factory=list)
    seen: dict[int, bytes] = field(default_factory=dict)
    ack_errors: int = 0
    ack_error_samples: list[str] = field(default_factory=list)
    redelivered: int = 0
    drained: bool = False
    failure: str | None = None


async def run_subscriber(role: Role, shared: Shared, window: Window,
                         subscriber: Any) -> SubscriberResult:
    """Receive (the driver ACKs), record ids and latencies; stop once every confirmed
    message arrived (plus a short linger for stray duplicates), or after a drain timeout."""
    plan = role.plan
    res = SubscriberResult()
    seen: dict[int, bytearray] = {}
    start_ns, end_ns = window.start_ns, window.end_ns
    received_shared = shared.received
    last_progress = time.perf_counter()

    def on_message(body: bytes, received_ns: int) -> None:
        nonlocal last_progress
        res.received += 1
        if len(body) < HEADER.size:
            res.unknown += 1
            return
        index, seq, sent_ns = HEADER.unpack_from(body)
        if len(body) != plan.size:
            res.bad_size += 1
        if index >= plan.publisher_count:
            res.unknown += 1
            return
        bits = seen.get(index)
        if bits is None:
            bits = seen[index] = bytearray()
        if seq >= len(bits):
            bits.extend(bytes(seq + 4096 - len(bits)))
        if bits[seq]:
            res.duplicates += 1
            return
        bits[seq] = 1
        res.unique += 1
        received_shared.value = res.unique
        if start_ns <= received_ns < end_ns:
            res.in_window += 1
        if start_ns <= sent_ns < end_ns:
            res.latencies_ns.append(received_ns - sent_ns)
        seconds = received_ns / 1e9
        if res.first_receive is None:
            res.first_receive = seconds
        res.last_receive = seconds
        last_progress = seconds

    subscriber.listen(on_message)
    try:
        while subscriber.failure is None and not shared.abort.value:
            expected = shared.expected.value
            now = time.perf_counter()
            if expected >= 0:
                if res.unique >= expected:
                    await asyncio.sleep(0.5)  # let any duplicate show itself
                    res.drained = res.unique == expected
                    break
                if now - last_progress > plan.drain_timeout:
                    res.failure = (f"drain: {expected - res.unique} of {expected} messages "
                                   f"not delivered after {plan.drain_timeout:g} s without one")
                    break
            elif now > window.start and now - last_progress > STALL_SECONDS \
                    and sum(shared.sent) > res.unique:
                res.failure = f"stall: no delivery for {STALL_SECONDS:g} s"
                break
            await asyncio.sleep(0.005)
    except Exception as exc:
        res.failure = f"{type(exc).__name__}: {exc}"
    if subscriber.failure is not None and res.failure is None:
        res.failure = f"connection: {subscriber.failure!r}"
    res.seen = {index: bytes(bits) for index, bits in seen.items()}
    res.ack_errors = subscriber.ack_errors
    res.ack_error_samples = list(subscriber.ack_error_samples)
    res.redelivered = getattr(subscriber, "redelivered", 0)
    return res


# ========================================================================= worker process


def worker_main(roles: list[Role], shared: Shared, results: Any) -> None:
    """Entry point of a load-generator process: run ``roles`` in one event loop."""
    try:
        if roles[0].plan.client_loop == "uvloop":
            import uvloop

            uvloop.run(_worker(roles, shared, results))
        else:
            asyncio.run(_worker(roles, shared, results))
    except BaseException as exc:
        results.put(("crash", os.getpid(), f"{exc!r}\n{traceback.format_exc()}"))


async def _worker(roles: list[Role], shared: Shared, results: Any) -> None:
    drivers: list[Any] = []
    try:
        for role in roles:
            if role.kind == "publisher":
                driver: Any = make_publisher(role.spec, role.index)
            else:
                driver = make_subscriber(role.spec)
            drivers.append(driver)
            await driver.connect()
    except Exception as exc:
        results.put(("failed", os.getpid(), f"connect: {type(exc).__name__}: {exc}"))
        await asyncio.gather(*(d.close() for d in drivers), return_exceptions=True)
        return
    for role in roles:
        results.put(("ready", role.key, None))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, shared.go.wait)
    if shared.abort.value:
        await asyncio.gather(*(d.close() for d in drivers), return_exceptions=True)
        return
    window = Window.of(roles[0].plan, shared.t0.value)
    cpu: dict[str, float] = {}

    def mark(name: str) -> None:
        cpu[name] = time.process_time()

    loop.call_later(max(0.0, window.start - time.perf_counter()), mark, "start")
    if math.isfinite(window.end):
        loop.call_later(max(0.0, window.end - time.perf_counter()), mark, "end")

    async def one(role: Role, driver: Any) -> None:
        if role.kind == "publisher":
            result: Any = await run_publisher(role, shared, window, driver)
        else:
            result = await run_subscriber(role, shared, window, driver)
        results.put(("result", role.key, asdict(result)))

    await asyncio.gather(*(one(r, d) for r, d in zip(roles, drivers, strict=True)))
    cpu.setdefault("start", cpu.get("start", time.process_time()))
    cpu.setdefault("end", time.process_time())
    await asyncio.gather(*(d.close() for d in drivers), return_exceptions=True)
    results.put(("cpu", os.getpid(), {"window": cpu["end"] - cpu["start"],
                                      "total": time.process_time(),
                                      "roles": [r.key for r in roles]}))


# ============================================================================= coordinator


@dataclass
class Target:
    """A broker under test as the coordinator sees it."""

    label: str  # "smqp-sqlite", "smqp-postgres", "rabbitmq-p1", "nats-b64", ...
    broker: str  # "smqp" | "rabbitmq" | "nats" | "mqtt"
    backend: str | None
    make_spec: Callable[[str], BrokerSpec]  # scenario -> spec
    probe: Callable[[], CpuProbe]
    prepare: Callable[[BrokerSpec], None] = lambda spec: None
    stored_count: Callable[[BrokerSpec], int | None] = lambda spec: None
    server_pid: int | None = None
    #: Extra work to finish the last scenario's writes (PostgreSQL: a CHECKPOINT).
    flush: Callable[[], None] = lambda: None
    #: The scenarios it runs (None: all; a peer's second window runs those with a subscriber).
    scenarios: tuple[str, ...] | None = None


def settle(target: Target) -> None:
    """Finish the writes the last scenario left behind before the next one starts.

    One heavy scenario leaves work that lands in the next one's measurement otherwise: the
    kernel writes back its dirty pages for some 30 s after (``vm.dirty_expire_centisecs``),
    and on PostgreSQL a checkpoint triggered by the WAL (measured: publish 273 MB, e2e
    287 MB) runs on for a dozen seconds. Seen here: the latency scenario's p99 was 15-24 ms
    after e2e, against 7 ms on its own. This runs the target's ``flush`` (PostgreSQL:
    ``CHECKPOINT``, which waits for it), then ``sync``, the same for every broker.
    ``--no-settle`` skips it.
    """
    target.flush()
    os.sync()


def _drain_queue(results: Any, timeout: float) -> tuple[str, Any, Any] | None:
    try:
        return results.get(timeout=timeout)
    except queue.Empty:
        return None


def run_scenario(target: Target, plan: Plan, *, layout: str,
                 profile: PySpy | None = None) -> dict[str, Any]:
    """Run one scenario against one broker; returns its JSON-ready record."""
    spec = target.make_spec(plan.scenario)
    record: dict[str, Any] = {"scenario": plan.scenario, "target": target.label,
                              "broker": target.broker, "backend": target.backend,
                              "destination": spec.target, "client_failures": []}
    failures: list[str] = record["client_failures"]
    target.prepare(spec)
    ctx = mp.get_context("spawn")
    shared = Shared(ctx, plan.publisher_count)
    results = ctx.Queue()
    roles = [Role("publisher", i, spec, plan) for i in range(plan.publisher_count)]
    if plan.has_subscriber:
        roles.insert(0, Role("subscriber", 0, spec, plan))
    groups = [[r] for r in roles] if layout == "process" else [roles]
    procs = [ctx.Process(target=worker_main, args=(g, shared, results), daemon=True,
                         name=f"bench-{target.label}-{g[0].key}") for g in groups]
    for proc in procs:
        proc.start()
    role_results: dict[str, dict[str, Any]] = {}
    cpu_reports: list[dict[str, Any]] = []
    probe = target.probe()
    cpu: dict[str, float | None] = {}
    try:
        # 1. Every role connected (the subscriber subscribed) before anything is published.
        ready: set[str] = set()
        deadline = time.monotonic() + 120
        while len(ready) < len(roles) and not failures:
            item = _drain_queue(results, 0.5)
            if item is not None:
                kind, who, detail = item
                if kind == "ready":
                    ready.add(who)
                else:
                    failures.append(f"{kind} {who}: {detail}")
            elif time.monotonic() > deadline:
                failures.append("workers did not get ready within 120 s")
            elif any(p.exitcode is not None for p in procs):
                failures.append("a worker process exited before it was ready")
        if failures:
            shared.abort.value = 1
            shared.go.set()
            return record
        # 2. Go; measure the server side over the window.
        t0 = time.perf_counter() + 0.3
        shared.t0.value = record["t0"] = t0
        window = Window.of(plan, t0)
        shared.go.set()
        time.sleep(max(0.0, window.start - time.perf_counter()))
        probe.start()
        probe_started = time.perf_counter()
        if profile is not None and not profile.start():
            record["profile_error"] = profile.error
            profile = None
        pending = {r.key for r in roles}
        publishers_left = {r.key for r in roles if r.kind == "publisher"}
        stop_probe_after = "subscriber" if plan.scenario == "e2e" else None
        limit = time.monotonic() + plan.warmup + plan.seconds + plan.drain_timeout + 180
        if plan.count_mode:
            limit += 3600
        while pending or len(cpu_reports) < len(procs):
            if not cpu and math.isfinite(window.end) and time.perf_counter() >= window.end:
                cpu = probe.stop(time.perf_counter() - probe_started)
            timeout = 0.2
            if not cpu and math.isfinite(window.end):
                timeout = max(0.001, min(timeout, window.end - time.perf_counter()))
            item = _drain_queue(results, timeout)
            if item is None:
                if time.monotonic() > limit:
                    failures.append("the scenario did not finish in time; workers killed")
                    break
                if all(p.exitcode is not None for p in procs) and (
                        pending or len(cpu_reports) < len(procs)):
                    # Let the queue's feeder deliver what it still has.
                    item = _drain_queue(results, 2.0)
                    if item is None:
                        failures.append("worker processes exited without all results: "
                                        f"{sorted(pending)}")
                        break
                else:
                    continue
            kind, who, detail = item
            if kind == "result":
                role_results[who] = detail
                pending.discard(who)
                publishers_left.discard(who)
                if not publishers_left and plan.has_subscriber and shared.expected.value < 0:
                    shared.expected.value = sum(
                        role_results[k]["confirmed"] for k in role_results
                        if k.startswith("publisher"))
                if not cpu and plan.count_mode and (
                        (stop_probe_after is None and not publishers_left)
                        or who == stop_probe_after):
                    cpu = probe.stop(time.perf_counter() - probe_started)
            elif kind == "cpu":
                cpu_reports.append(detail)
            else:
                failures.append(f"{kind} {who}: {detail}")
                shared.abort.value = 1
        if not cpu:
            cpu = probe.stop(time.perf_counter() - probe_started)
    finally:
        shared.abort.value = 1
        shared.go.set()
        for proc in procs:
            proc.join(timeout=15)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        results.close()
        if profile is not None:
            if profile.wait():
                summary = summarize_collapsed(profile.output, top=30)
                record["profile"] = summary
            else:
                record["profile_error"] = profile.error
    record["stored_after"] = target.stored_count(spec)
    return summarize(record, plan, role_results, cpu, cpu_reports)


def _latency_summary(values_ms: list[float]) -> dict[str, float | int | None]:
    values = sorted(values_ms)

    def pct(p: float) -> float | None:
        v = percentile(values, p)
        return None if math.isnan(v) else v

    return {"count": len(values), "mean": sum(values) / len(values) if values else None,
            "p50": pct(50), "p95": pct(95), "p99": pct(99), "max": values[-1] if values else None}


def summarize(record: dict[str, Any], plan: Plan, results: dict[str, dict[str, Any]],
              cpu: dict[str, float | None], cpu_reports: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Figures and the correctness checks of one scenario run."""
    pubs = [results[k] for k in sorted(results) if k.startswith("publisher")]
    sub = results.get("subscriber")
    failures: list[str] = record["client_failures"]
    for who, r in results.items():
        if r.get("failure"):
            failures.append(f"{who}: {r['failure']}")
    confirmed = sum(p["confirmed"] for p in pubs)
    errors: dict[str, int] = {
        "publish_refused": sum(p["failed"] for p in pubs),
        "missing": 0, "duplicates": 0, "unknown": 0, "delivered_though_refused": 0,
        "bad_size": 0, "ack_refused": 0, "stored_count_mismatch": 0,
        "client_failures": len(failures),
    }
    samples = [s for p in pubs for s in p["failed_samples"]]
    elapsed = plan.seconds
    if plan.count_mode:  # from "go" to the last confirm (publish) or delivery (e2e)
        if plan.scenario == "e2e":
            ends = (sub or {}).get("last_receive") or record["t0"]
        else:
            ends = max((p["last_confirm"] or record["t0"]) for p in pubs) if pubs \
                else record["t0"]
        elapsed = max(1e-9, ends - record["t0"])
    if plan.scenario == "publish":
        count = confirmed if plan.count_mode else sum(p["confirmed_in_window"] for p in pubs)
    elif plan.scenario == "e2e":
        count = (sub["unique"] if plan.count_mode else sub["in_window"]) if sub else 0
    else:
        count = sum(p["sent_in_window"] for p in pubs)
    record["elapsed"] = elapsed
    record["count"] = count
    record["msgs_per_s"] = count / elapsed if elapsed else None
    record["published"] = sum(p["sent"] for p in pubs)
    record["confirmed"] = confirmed
    record["confirm_latency_ms"] = _latency_summary(
        [v for p in pubs for v in p["confirm_latencies_ms"]])
    record["backlog_waits"] = sum(p["backlog_waits"] for p in pubs)
    record["max_send_lateness_ms"] = max((p["max_lateness_ms"] for p in pubs), default=0.0)
    if sub is not None:
        record["delivered"] = sub["unique"]
        record["latency_ms"] = _latency_summary([v / 1e6 for v in sub["latencies_ns"]])
        record["redelivered"] = sub["redelivered"]
        errors["duplicates"] = sub["duplicates"]
        errors["unknown"] = sub["unknown"]
        errors["bad_size"] = sub["bad_size"]
        errors["ack_refused"] = sub["ack_errors"]
        samples += sub["ack_error_samples"]
        missing_examples: list[str] = []
        for p in pubs:
            bits = sub["seen"].get(p["index"], b"")
            refused = set(p["failed_tokens"])
            for seq in range(p["sent"]):
                got = seq < len(bits) and bits[seq]
                if seq in refused:
                    if got:
                        errors["delivered_though_refused"] += 1
                elif not got:
                    errors["missing"] += 1
                    if len(missing_examples) < 5:
                        missing_examples.append(f"publisher {p['index']} seq {seq}")
            errors["unknown"] += sum(bits[p["sent"]:])
        if missing_examples:
            samples.append(f"missing e.g. {', '.join(missing_examples)}")
    stored = record["stored_after"]
    if stored is not None:
        want = confirmed if (plan.scenario == "publish" or record["broker"] == "smqp") else 0
        record["stored_expected"] = want
        if stored != want:
            errors["stored_count_mismatch"] = abs(stored - want)
            samples.append(f"{stored} messages stored / left after the run, expected {want}")
    record["errors"] = errors
    record["error_count"] = sum(errors.values())
    record["error_samples"] = samples[:20]
    cpu = dict(cpu)
    measured = plan.seconds if not plan.count_mode else elapsed

    def client_cpu(reports: list[dict[str, Any]]) -> float | None:
        used = sum(r["window"] for r in reports)
        return 100 * used / measured if reports and measured else None

    # Each process's CPU over the window (in count mode: until it finished).
    cpu["clients"] = client_cpu(cpu_reports)
    if any(len(r["roles"]) == 1 for r in cpu_reports):  # one role per process
        cpu["subscriber"] = client_cpu([r for r in cpu_reports if r["roles"] == ["subscriber"]])
        cpu["publishers"] = client_cpu(
            [r for r in cpu_reports if r["roles"] and r["roles"][0].startswith("publisher")])
    known = [cpu.get(k) for k in ("server", "postgres", "redis", "clients")]
    if cpu.get("machine") is not None:
        # Whatever else ran on the machine meanwhile (should be ~0 on a quiet machine).
        cpu["other"] = max(0.0, cpu["machine"] - sum(v for v in known if v is not None))
    record["cpu_percent"] = cpu
    record["client_processes"] = len(cpu_reports)
    return record


# ============================================================================ SMQP target

SETUP_CODE = r'''
import json
from django.db import transaction
from accounts.models import Account
from broker.services.topics import create_topic
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import AccessSnapshot

cfg = json.loads(CONFIG)
with transaction.atomic():
    publishers = []
    for i in range(cfg["publishers"]):
        account = Account(username=f"{cfg['pub_prefix']}{i}")
        account.set_password(cfg["password"])
        account.save()
        publishers.append(account)
    subscriber = Account(username=cfg["sub_user"])
    subscriber.set_password(cfg["password"])
    subscriber.save()
    snapshot = AccessSnapshot(Account.objects.get(username=cfg["root_user"]))
    top = create_topic(snapshot, cfg["root"])
    for scenario in cfg["scenarios"]:
        create_topic(snapshot, f"{cfg['root']}/{scenario}")
    for account in publishers:
        UALEntry.objects.create(topic=top, principal_kind="account", account=account,
                                right="publish")
    UALEntry.objects.create(topic=top, principal_kind="account", account=subscriber,
                            right="subscribe")
    # --ual-entries: a populated access list (issue 5). Most entries are other accounts' on
    # a tree of their own; one in ten concerns the benchmark accounts through a group they
    # belong to, and one in twenty is for everyone, some of them on /bench itself, so the
    # publishers' and the subscriber's decisions walk past real entries.
    extra = cfg["ual_entries"]
    if extra:
        from django.contrib.auth.models import Group
        group = Group.objects.create(name="bench_group")
        group.user_set.add(subscriber, *publishers)
        others = []
        for i in range(100):
            other = Account(username=f"benchother{i}")
            other.set_unusable_password()
            other.save()
            others.append(other)
        org = create_topic(snapshot, "/org")
        leaves = []
        for d in range(10):
            dept = create_topic(snapshot, f"/org/dept{d}")
            leaves.append(dept)
            for t in range(19):
                leaves.append(create_topic(snapshot, f"/org/dept{d}/team{t}"))
        bench_levels = [top] + [Topic.objects.get(path=f"{cfg['root']}/{s}")
                                for s in cfg["scenarios"]]
        import random
        rng = random.Random(1)
        rights = ["publish", "subscribe", "manage", "modify", "reply", "remote"]
        entries, seen = [], set()
        while len(entries) < extra:
            n = len(entries) + 1
            right = rng.choice(rights)
            if n % 20 == 0:
                topic, kind, who = rng.choice(bench_levels + leaves), "everyone", None
                if topic.key.startswith(cfg["root"]) and right in ("publish", "subscribe"):
                    right = "modify"  # leave the benchmark's own rights as they are
            elif n % 10 == 0:
                topic, kind, who = rng.choice(bench_levels + leaves), "group", None
                if right in ("publish", "subscribe"):
                    right = "manage"
            else:
                topic, kind, who = rng.choice(leaves), "account", rng.choice(others)
            key = (topic.pk, kind, who.pk if who else None, right)
            if key in seen:
                continue
            seen.add(key)
            entries.append(UALEntry(topic=topic, principal_kind=kind, right=right,
                                    effect="deny" if rng.random() < 0.15 else "allow",
                                    account=who, group=group if kind == "group" else None))
        UALEntry.objects.bulk_create(entries)
print(json.dumps({"accounts": Account.objects.count(), "topics": Topic.objects.count(),
                  "ual_entries": UALEntry.objects.count()}))
'''


def seed(broker: BrokerEnv, publishers: int, ual_entries: int = 0) -> dict[str, int]:
    """Accounts (a superuser, the publishers, the subscriber), ``/bench/<scenario>`` topics
    and the rights: ``publish`` for the publishers and ``subscribe`` for the subscriber on
    ``/bench`` (so on every scenario topic); and ``ual_entries`` more UAL entries."""
    broker.manage("createaccount", ROOT_USER, "--password", PASSWORD, "--superuser")
    config = json.dumps({"publishers": publishers, "pub_prefix": PUB_PREFIX,
                         "sub_user": SUB_USER, "password": PASSWORD, "root_user": ROOT_USER,
                         "root": TOPIC_ROOT, "scenarios": list(SCENARIOS),
                         "ual_entries": ual_entries})
    out = broker.run_python(f"CONFIG = {config!r}\n{SETUP_CODE}")
    return json.loads(out.strip().splitlines()[-1])


def smqp_stored_count(host: str, port: int, topic: str) -> int | None:
    """``COUNT MESSAGE <topic>`` as the superuser; None when it fails."""

    async def count() -> int | None:
        client = await SMQPClient.connect(host, port)
        try:
            await client.login(ROOT_USER, PASSWORD)
            reply = await asyncio.wait_for(client.command(f"COUNT MESSAGE {topic}"), 60)
            return int(reply.last_text) if reply.ok and reply.last_text.isdigit() else None
        finally:
            await client.quit()

    try:
        return asyncio.run(count())
    except Exception:
        return None


def smqp_target(broker: RunningBroker, tls: tuple[int, str] | None = None, window: int = 1,
                first: bool = True) -> Target:
    """The broker's plain listener, or with ``tls`` = (SMQPS port, CA file) its TLS one;
    ``window``: the subscriber's SET NOTIFY WINDOW (a run other than the ``first`` of a
    listener runs the scenarios with a subscriber only)."""
    port, ca = tls if tls else (broker.port, "")
    # A topic's stored messages before a run: the TLS runs follow the plain ones on the same
    # topics, and each run's check counts only what it stored.
    before: dict[str, int] = {}

    def prepare(spec: BrokerSpec) -> None:
        before[spec.target] = smqp_stored_count(broker.host, broker.port, spec.target) or 0

    def stored_count(spec: BrokerSpec) -> int | None:
        stored = smqp_stored_count(broker.host, broker.port, spec.target)
        return None if stored is None else stored - before.get(spec.target, 0)

    def spec(scenario: str) -> BrokerSpec:
        return BrokerSpec(kind="smqp", host=broker.host, port=port,
                          target=topic_for(scenario), password=PASSWORD,
                          publisher_user_prefix=PUB_PREFIX, subscriber_user=SUB_USER,
                          tls_ca=ca, window=window)

    def probe() -> CpuProbe:
        groups: dict[str, Callable[[], list[int]]] = {
            "server": lambda: [broker.pid] if broker.alive() else []}
        if broker.backend == "postgres":
            groups["postgres"] = postgres_backend_pids(broker.database_url.rsplit("/", 1)[1])
        groups["redis"] = redis_pids
        return CpuProbe(groups)

    return Target(
        label=f"smqp-{broker.backend}{'-tls' if tls else ''}{f'-w{window}' if window > 1 else ''}",
        broker="smqp", backend=broker.backend,
        scenarios=None if first else WITH_SUBSCRIBER,
        make_spec=spec, probe=probe,
        prepare=prepare, stored_count=stored_count,
        server_pid=broker.pid,
        flush=pg_checkpoint if broker.backend == "postgres" else lambda: None,
    )


@contextlib.contextmanager
def test_certificate() -> Iterator[tuple[str, dict[str, str]]]:
    """A CA and a localhost certificate made by trustme in a temporary directory: (the CA
    file, the server's SMQP_TLS_* settings with a free SMQPS port)."""
    import tempfile

    import trustme

    with tempfile.TemporaryDirectory(prefix="smqp-bench-tls-") as tmp:
        ca = trustme.CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        ca_file, cert_file, key_file = (f"{tmp}/ca.pem", f"{tmp}/cert.pem", f"{tmp}/key.pem")
        ca.cert_pem.write_to_path(ca_file)
        cert.cert_chain_pems[0].write_to_path(cert_file)
        cert.private_key_pem.write_to_path(key_file)
        yield ca_file, {"SMQP_TLS_CERT": cert_file, "SMQP_TLS_KEY": key_file,
                        "SMQP_TLS_PORT": "0"}


def smqps_port(broker: RunningBroker, timeout: float = 30) -> int:
    """The SMQPS port the broker printed (its TLS listener starts right after the plain one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"SMQPS listening on [\d.]+:(\d+)", broker.log())
        if match:
            return int(match[1])
        time.sleep(0.05)
    raise BrokerSetupError(f"no SMQPS listener:\n{broker.log()}")


# ============================================================================= peer targets

WITH_SUBSCRIBER = ("e2e", "latency")


def rabbit_target(args: argparse.Namespace, prefetch: int = 1, first: bool = True) -> Target:
    tag = uuid.uuid4().hex[:8]

    def spec(scenario: str) -> BrokerSpec:
        return BrokerSpec(kind="rabbitmq", host=args.rabbitmq_host, port=args.rabbitmq_port,
                          target=f"smqp-bench-{scenario}-{tag}", user=args.rabbitmq_user,
                          password=args.rabbitmq_password, window=prefetch)

    return Target(label=f"rabbitmq-p{prefetch}", broker="rabbitmq", backend=None,
                  make_spec=spec, probe=lambda: CpuProbe({"server": rabbitmq_pids}),
                  prepare=rabbit_declare, stored_count=rabbit_count_and_delete,
                  scenarios=None if first else WITH_SUBSCRIBER)


def nats_target(args: argparse.Namespace, batch: int = 1, first: bool = True) -> Target:
    tag = uuid.uuid4().hex[:8]

    def spec(scenario: str) -> BrokerSpec:
        return BrokerSpec(kind="nats", host=args.nats_host, port=args.nats_port,
                          target=f"{scenario}{tag}", window=batch)

    return Target(label=f"nats-b{batch}", broker="nats", backend=None, make_spec=spec,
                  probe=lambda: CpuProbe({"server": lambda: find_pids(comm="nats-server")}),
                  prepare=nats_declare, stored_count=nats_count_and_delete,
                  scenarios=None if first else WITH_SUBSCRIBER)


MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
# The defaults drop QoS 1 messages beyond 1,000 queued per client: no limit here.
max_queued_messages 0
max_queued_bytes 0
persistence false
log_dest stderr
log_type error
log_type warning
"""


@contextlib.contextmanager
def own_mosquitto(binary: str = "mosquitto") -> Iterator[tuple[int, int]]:
    """A Mosquitto of the benchmark's own on a free port: (port, pid)."""
    import shutil
    import socket
    import subprocess
    import tempfile

    path = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/local/sbin")
    if path is None:
        raise BrokerSetupError(f"{binary} is not installed")
    with tempfile.TemporaryDirectory(prefix="smqp-bench-mosquitto-") as tmp:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        conf = f"{tmp}/mosquitto.conf"
        with open(conf, "w") as handle:
            handle.write(MOSQUITTO_CONF.format(port=port))
        log = open(f"{tmp}/mosquitto.log", "wb")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen([path, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise BrokerSetupError("mosquitto did not start: " + Path(
                            f"{tmp}/mosquitto.log").read_text(errors="replace")) from None
                    time.sleep(0.1)
            yield port, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def mosquitto_target(port: int, pid: int) -> Target:
    tag = uuid.uuid4().hex[:8]

    def spec(scenario: str) -> BrokerSpec:
        return BrokerSpec(kind="mqtt", host="127.0.0.1", port=port,
                          target=f"smqp-bench/{scenario}/{tag}", window=20)

    return Target(label="mosquitto-qos1", broker="mqtt", backend=None, make_spec=spec,
                  probe=lambda: CpuProbe({"server": lambda: [pid]}))


# ============================================================================== reporting


def _f(value: Any) -> float:
    return math.nan if value is None else float(value)


def headline(run: dict[str, Any]) -> float | None:
    """The scenario's main figure: msgs/s, or p99 ms for ``latency``."""
    if run["scenario"] == "latency":
        return (run.get("latency_ms") or {}).get("p99")
    return run.get("msgs_per_s")


def print_run(run: dict[str, Any]) -> None:
    """One scenario run, in a few lines."""
    cpu = run.get("cpu_percent") or {}
    parts = [f"[{run['target']}] {run['scenario']}:"]
    if run.get("msgs_per_s") is not None:
        what = "sent at" if run["scenario"] == "latency" else "throughput"
        parts.append(f"{what} {run['msgs_per_s']:,.0f} msgs/s ({run['count']:,} in "
                     f"{run['elapsed']:.2f} s)")
    lat = run.get("latency_ms")
    if lat and lat.get("count"):
        parts.append(f"latency p50 {lat['p50']:.2f} / p95 {lat['p95']:.2f} / p99 "
                     f"{lat['p99']:.2f} / max {lat['max']:.2f} ms (n={lat['count']:,})")
    print(" ".join(parts))
    conf = run.get("confirm_latency_ms") or {}
    detail = [f"published {run.get('published', 0):,}, confirmed {run.get('confirmed', 0):,}"]
    if "delivered" in run:
        detail.append(f"delivered {run['delivered']:,}")
    if conf.get("count"):
        detail.append(f"confirm latency p50 {conf['p50']:.2f} / p99 {conf['p99']:.2f} ms")
    if run.get("stored_after") is not None:
        detail.append(f"stored/left after: {run['stored_after']:,}")
    print("   " + "; ".join(detail))
    cpu_text = ", ".join(f"{k} {v:.0f}%" for k, v in cpu.items() if v is not None)
    if cpu_text:
        print(f"   CPU (% of one core): {cpu_text} [{run.get('client_processes', 0)} client "
              "process(es)]")
    if run.get("error_count"):
        bad = {k: v for k, v in run["errors"].items() if v}
        print(f"   ERRORS: {bad}")
        for sample in run.get("error_samples", [])[:8]:
            print(f"     e.g. {sample}")
    for failure in run.get("client_failures", [])[:8]:
        print(f"   client failure: {failure}")
    if run.get("profile_error"):
        print(f"   profile: {run['profile_error']}")


def target_text(scenario: str, value: float | None) -> str:
    _unit, goal = TARGETS[scenario]
    if value is None or math.isnan(value):
        return "-"
    met = value <= goal if scenario == "latency" else value >= goal
    op = "<=" if scenario == "latency" else ">="
    return f"{op}{goal:,.0f} {'met' if met else 'not met'}"


def peer_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every SMQP run's figures over every peer run's of the same scenario."""

    def ratio(mine: float | None, theirs: float | None) -> float | None:
        return mine / theirs if mine and theirs else None

    ratios = []
    for run in runs:
        if run["broker"] != "smqp":
            continue
        for base in runs:
            if base["broker"] == "smqp" or base["scenario"] != run["scenario"]:
                continue
            entry: dict[str, Any] = {"scenario": run["scenario"], "target": run["target"],
                                     "peer": base["target"],
                                     "msgs_per_s": ratio(run.get("msgs_per_s"),
                                                         base.get("msgs_per_s"))}
            for pct in ("p50", "p99"):
                entry[f"latency_{pct}"] = ratio((run.get("latency_ms") or {}).get(pct),
                                                (base.get("latency_ms") or {}).get(pct))
            ratios.append(entry)
    return ratios


def print_tables(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary table, and SMQP/peer ratios; returns the ratios."""
    rows = []
    for run in runs:
        cpu = run.get("cpu_percent") or {}
        lat = run.get("latency_ms") or {}
        db = cpu.get("postgres")
        rows.append([
            run["scenario"], run["target"], _f(run.get("msgs_per_s")),
            _f(lat.get("p50")), _f(lat.get("p99")), _f(lat.get("max")),
            run.get("error_count", 0), _f(cpu.get("server")), _f(db), _f(cpu.get("clients")),
            _f(cpu.get("machine")), _f(cpu.get("other")),
            target_text(run["scenario"], headline(run)),
        ])
    print()
    print(format_table(["scenario", "broker", "msgs/s", "p50 ms", "p99 ms", "max ms", "errors",
                        "server CPU%", "pg CPU%", "client CPU%", "machine CPU%", "other CPU%",
                        "issue target"],
                       rows))
    ratios = peer_ratios(runs)
    if ratios:
        print()
        print("SMQP / peer (throughput: > 1 is faster than the peer; latency: < 1 is lower)")
        print(format_table(["scenario", "broker", "peer", "msgs/s ratio", "p50 ratio",
                            "p99 ratio"],
                           [[e["scenario"], e["target"], e["peer"], _f(e["msgs_per_s"]),
                             _f(e["latency_p50"]), _f(e["latency_p99"])] for e in ratios]))
    return ratios


# =================================================================================== CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``messages`` benchmark."""
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all",
                        help="which scenario(s) to run (default all)")
    parser.add_argument("--db", choices=[*BACKENDS, "both"], default="both",
                        help="database backend(s) of the SMQP broker (default both)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measured seconds per scenario (default 10)")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds of load before measuring (default 1)")
    parser.add_argument("--messages", type=int, default=None, metavar="N",
                        help="publish/e2e: send N messages in all instead of running for "
                             "--seconds (latency always runs for --seconds)")
    parser.add_argument("--size", type=int, default=256, help="body bytes (default 256)")
    parser.add_argument("--ual-entries", type=int, default=0, metavar="N",
                        help="seed N more UAL entries in the tree (issue 5: compare N=1000 "
                             "with 0)")
    parser.add_argument("--window", type=int, default=64, metavar="W",
                        help="unconfirmed publishes in flight per publisher (default 64)")
    parser.add_argument("--publishers", type=int, default=4,
                        help="concurrent publishers for publish and e2e (default 4)")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="latency: messages per second (default 1000)")
    parser.add_argument("--max-backlog", type=int, default=1000, metavar="N",
                        help="e2e: publishers wait while more than N messages are published "
                             "but not yet delivered (default 1000; 0 = no limit)")
    parser.add_argument("--drain-timeout", type=float, default=20.0,
                        help="seconds without a delivery before undelivered messages are "
                             "reported missing (default 20)")
    parser.add_argument("--layout", choices=["process", "single"], default="process",
                        help="process: one OS process per publisher/subscriber (default); "
                             "single: all of them in one asyncio process")
    parser.add_argument("--client-loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="event loop of the load-generator processes, for both brokers "
                             "(default uvloop: the standard library's costs the client about "
                             "twice as much per round trip, which the e2e figure then measures)")
    parser.add_argument("--smqp-window", type=parse_windows, default=(1, 64), metavar="N,M",
                        help="SMQP subscriber windows (SET NOTIFY WINDOW, profile 9.7); the "
                             "first runs every scenario, the others e2e and latency (1,64)")
    parser.add_argument("--rabbitmq", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the scenarios against RabbitMQ (default on)")
    parser.add_argument("--rabbitmq-host", default=os.environ.get("SMQP_BENCH_AMQP_HOST",
                                                                  "127.0.0.1"))
    parser.add_argument("--rabbitmq-port", type=int,
                        default=int(os.environ.get("SMQP_BENCH_AMQP_PORT", "5672")))
    parser.add_argument("--rabbitmq-user", default=os.environ.get("SMQP_BENCH_AMQP_USER",
                                                                  "guest"))
    parser.add_argument("--rabbitmq-password",
                        default=os.environ.get("SMQP_BENCH_AMQP_PASSWORD", "guest"))
    parser.add_argument("--rabbitmq-prefetch", type=parse_windows, default=(1, 64),
                        metavar="N,M", help="RabbitMQ subscriber prefetch values (1,64)")
    parser.add_argument("--nats", action=argparse.BooleanOptionalAction, default=True,
                        help="also run NATS JetStream when it answers (default on)")
    parser.add_argument("--nats-host", default=os.environ.get("SMQP_BENCH_NATS_HOST",
                                                              "127.0.0.1"))
    parser.add_argument("--nats-port", type=int,
                        default=int(os.environ.get("SMQP_BENCH_NATS_PORT", "4222")))
    parser.add_argument("--nats-batch", type=parse_windows, default=(1, 64), metavar="N,M",
                        help="NATS JetStream pull batch values (1,64)")
    parser.add_argument("--mosquitto", action=argparse.BooleanOptionalAction, default=True,
                        help="also run MQTT QoS 1 on a Mosquitto of its own, a reference "
                             "whose semantics differ (default on)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the SMQP server with py-spy during each measured window "
                             "(slows it down: take figures from a run without it)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the server logs in bench/results even without problems")
    parser.add_argument("--tls", action="store_true",
                        help="also run every scenario over SMQPS (TLS; a test certificate "
                             "made by trustme) on the same broker, to compare with plain TCP")
    parser.add_argument("--no-json", action="store_true", help="do not write a results file")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the SMQP server under test, e.g. "
                             "SMQP_PUBLISH_LINGER_MS=0 (repeatable; for A/B runs)")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="start each scenario at once, without first finishing the writes "
                             "the one before left (a PostgreSQL CHECKPOINT, then sync)")


def main(args: argparse.Namespace) -> int:
    """Run the scenarios on each SMQP backend, then on the peers; print and save figures."""
    if args.size < HEADER.size:
        raise SystemExit(f"--size must be at least {HEADER.size} (the id and timestamp)")
    if args.window < 1 or args.publishers < 1 or args.seconds <= 0 or args.rate <= 0:
        raise SystemExit("--window and --publishers must be >= 1; --seconds, --rate > 0")
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    backends = BACKENDS if args.db == "both" else (args.db,)
    if any(not item.partition("=")[0] or "=" not in item for item in args.server_env):
        raise SystemExit("--server-env takes NAME=VALUE")
    server_env = dict(item.partition("=")[::2] for item in args.server_env)
    check_services(backends)
    stamp = timestamp()
    runs: list[dict[str, Any]] = []
    brokers: list[dict[str, Any]] = []

    def plan_for(scenario: str) -> Plan:
        return Plan(scenario=scenario, publishers=args.publishers, size=args.size,
                    window=args.window, seconds=args.seconds, warmup=args.warmup,
                    messages=args.messages, rate=args.rate, max_backlog=args.max_backlog,
                    drain_timeout=args.drain_timeout, client_loop=args.client_loop)

    def run_all(target: Target) -> None:
        for scenario in scenarios:
            if target.scenarios is not None and scenario not in target.scenarios:
                continue
            plan = plan_for(scenario)
            if args.settle:
                settle(target)
            profiler = None
            if args.profile and target.server_pid is not None:
                profiler = PySpy(target.server_pid,
                                 RESULTS_DIR / f"{stamp}-profile-{target.label}-{scenario}.txt",
                                 args.seconds)
            print(f"[{target.label}] {scenario}: {args.warmup:g}+{args.seconds:g} s ...",
                  flush=True)
            run = run_scenario(target, plan, layout=args.layout, profile=profiler)
            runs.append(run)
            print_run(run)
            if run.get("profile"):
                print(format_summary(run["profile"]))

    for backend in backends:
        print(f"[smqp-{backend}] preparing an isolated broker (migrate, accounts, topics) ...",
              flush=True)
        seeded: dict[str, int] = {}

        def setup(env: BrokerEnv, seeded: dict[str, int] = seeded) -> None:
            seeded.update(seed(env, args.publishers, args.ual_entries))

        with contextlib.ExitStack() as stack:
            env = dict(server_env)
            ca_file = ""
            if args.tls:
                ca_file, tls_env = stack.enter_context(test_certificate())
                env.update(tls_env)
            broker = stack.enter_context(isolated_broker(
                backend, setup=setup, log_dir=RESULTS_DIR,
                log_name=f"{stamp}-{NAME}-{backend}-server", extra_env=env))
            broker.keep_log = args.keep_logs
            print(f"[smqp-{backend}] runsmqp pid {broker.pid} on {broker.host}:{broker.port}",
                  flush=True)
            start = len(runs)
            for i, window in enumerate(args.smqp_window):
                run_all(smqp_target(broker, window=window, first=i == 0))
            if args.tls:
                tls_port = smqps_port(broker)
                print(f"[smqp-{backend}-tls] SMQPS on {broker.host}:{tls_port}", flush=True)
                for i, window in enumerate(args.smqp_window):
                    run_all(smqp_target(broker, (tls_port, ca_file), window, first=i == 0))
            alive = broker.alive()
            if not alive or any(r.get("error_count") for r in runs[start:]):
                broker.keep_log = True
        info = {"target": f"smqp-{backend}", "seeded": seeded, "alive_at_end": alive,
                "server_exit_code": broker.returncode,
                "server_log": str(broker.saved_log) if broker.saved_log else None,
                "server_log_problems": broker.log_problems[:50],
                "server_log_problem_count": len(broker.log_problems)}
        brokers.append(info)
        if not alive:
            runs[-1]["client_failures"].append("runsmqp exited during the run")
            runs[-1]["error_count"] = runs[-1].get("error_count", 0) + 1
        if info["server_log_problem_count"]:
            print(f"[smqp-{backend}] server log: {info['server_log_problem_count']} "
                  "suspicious lines, e.g.:")
            for line in info["server_log_problems"][:10]:
                print(f"     | {line}")
        if info["server_log"]:
            print(f"[smqp-{backend}] server log kept at {info['server_log']}")

    skipped: dict[str, str] = {}
    if args.rabbitmq:
        problem = rabbit_check(rabbit_target(args).make_spec("check"))
        if problem is None:
            brokers.append({"target": "rabbitmq", "pids": rabbitmq_pids()})
            for i, prefetch in enumerate(args.rabbitmq_prefetch):
                run_all(rabbit_target(args, prefetch, first=i == 0))
        else:
            skipped["rabbitmq"] = (f"RabbitMQ at {args.rabbitmq_host}:{args.rabbitmq_port} "
                                   f"is not reachable: {problem}")
    if args.nats:
        problem = nats_check(nats_target(args).make_spec("check"))
        if problem is None:
            brokers.append({"target": "nats"})
            for i, batch in enumerate(args.nats_batch):
                run_all(nats_target(args, batch, first=i == 0))
        else:
            skipped["nats"] = (f"NATS JetStream at {args.nats_host}:{args.nats_port} is not "
                               f"answering: {problem}")
    if args.mosquitto:
        try:
            with own_mosquitto() as (port, pid):
                brokers.append({"target": "mosquitto", "port": port})
                run_all(mosquitto_target(port, pid))
        except BrokerSetupError as exc:
            skipped["mosquitto"] = str(exc)
    for name, why in skipped.items():
        print(f"[{name}] skipped: {why}")

    ratios = print_tables(runs)
    if not args.no_json:
        payload = {
            "benchmark": NAME,
            "timestamp": stamp,
            "args": {k: v for k, v in vars(args).items() if not callable(v)},
            "environment": environment_info(),
            "targets": {k: {"unit": u, "value": v} for k, (u, v) in TARGETS.items()},
            "brokers": brokers,
            "peers_skipped": skipped,
            "runs": runs,
            "ratios_smqp_over_peers": ratios,
        }
        path = write_results(NAME, payload, stamp=stamp)
        print(f"\nresults written to {path}")
    bad = [f"{r['target']}/{r['scenario']}" for r in runs if r.get("error_count")]
    if bad:
        print(f"runs with errors: {', '.join(bad)}")
    return 1 if bad else 0
