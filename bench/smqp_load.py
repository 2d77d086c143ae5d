"""The ``commands`` benchmark: commands per second for a mixed LIST/FIND/COUNT/NOOP load.

For each database backend it starts an isolated broker seeded with a superuser ``root``, the
accounts ``load0..loadN-1`` (password ``pw``) and a topic tree ``/t0../tT-1``, each with the
children ``/tI/c000..`` carrying keywords; ``everyone`` holds the ``subscribe`` right on every
first-level topic so the load accounts see the whole tree. Then N concurrent clients each log
in and run a closed loop for a fixed time: one command outstanding (or ``--pipeline K``), the
next sent when a reply arrives. Each command's latency is taken with ``time.perf_counter``
from the write to the end of its reply.

A reply whose code is not 200 is an error; a 200 reply whose content is not what the seeded
tree implies (e.g. LIST TOPIC not listing every child) is counted as ``unexpected``. A healthy
run has zero of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .client import Reply, SMQPClient
from .isolated import BACKENDS, BrokerEnv, RunningBroker, check_services, isolated_broker
from .stats import (
    RESULTS_DIR,
    Samples,
    environment_info,
    format_table,
    timestamp,
    write_results,
)

NAME = "smqp-commands"
PASSWORD = "pw"
USER_PREFIX = "load"
REPLY_TIMEOUT = 60.0

#: Command kinds and their share of the load (weights).
MIX: tuple[tuple[str, float], ...] = (
    ("LIST TOPIC", 25),
    ("FIND TOPIC", 25),
    ("COUNT TOPIC", 12.5),
    ("COUNT SUB", 12.5),
    ("NOOP", 25),
)


@dataclass(frozen=True)
class TreeShape:
    """The seeded topic tree: ``topics`` first-level topics with ``children`` each."""

    topics: int = 20
    children: int = 10

    def child(self, t: int, c: int) -> str:
        return f"/t{t}/c{c:03d}"

    @staticmethod
    def keyword(c: int) -> str:
        # Zero-padded so that no keyword is a substring of another (FIND matches substrings).
        return f"kw{c:03d}"


# ----------------------------------------------------------------------------- seeding

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
    for i in range(cfg["accounts"]):
        account = Account(username=f"{cfg['prefix']}{i}")
        account.set_password(cfg["password"])
        account.save()
    snapshot = AccessSnapshot(Account.objects.get(username="root"))
    for t in range(cfg["topics"]):
        top = create_topic(snapshot, f"/t{t}", ("bench", f"group{t}"), None)
        UALEntry.objects.create(topic=top, principal_kind="everyone", right="subscribe")
        for c in range(cfg["children"]):
            create_topic(snapshot, f"/t{t}/c{c:03d}", (f"kw{c:03d}", f"group{t}", "bench"), None)
print(json.dumps({"accounts": Account.objects.count(), "topics": Topic.objects.count(),
                  "ual_entries": UALEntry.objects.count()}))
'''


def seed(broker: BrokerEnv, accounts: int, shape: TreeShape) -> dict[str, int]:
    """Create ``root``, the load accounts and the topic tree; returns the object counts."""
    broker.manage("createaccount", "root", "--password", PASSWORD, "--superuser")
    config = json.dumps({"accounts": accounts, "prefix": USER_PREFIX, "password": PASSWORD,
                         "topics": shape.topics, "children": shape.children})
    out = broker.run_python(f"CONFIG = {config!r}\n{SETUP_CODE}")
    return json.loads(out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- commands

Check = Callable[[Reply], bool]


def make_command(kind: str, rng: random.Random, shape: TreeShape) -> tuple[str, Check]:
    """A command line of ``kind`` on a random part of the tree, and a check of its reply."""
    t = rng.randrange(shape.topics)
    c = rng.randrange(shape.children)
    if kind == "LIST TOPIC":
        # 200-OK, then one line per child.
        return f"LIST TOPIC /t{t}", lambda r: len(r.lines) == shape.children + 1
    if kind == "FIND TOPIC":
        kw = shape.keyword(c)
        want = shape.child(t, c).casefold()
        return (f"FIND TOPIC /t{t}/* ({kw})",
                lambda r: len(r.lines) == 2 and r.last_text.casefold().startswith(want))
    if kind == "COUNT TOPIC":
        return f"COUNT TOPIC /t{t}/*", lambda r: r.last_text == str(shape.children)
    if kind == "COUNT SUB":
        return f"COUNT SUB {shape.child(t, c)}", lambda r: r.last_text == "0"
    if kind == "NOOP":
        return "NOOP", lambda r: r.lines == ["200 OK"]
    raise ValueError(f"unknown command kind {kind!r}")


# ----------------------------------------------------------------------------- load

@dataclass
class LoadResult:
    """What the load generator measured."""

    samples: Samples = field(default_factory=Samples)
    unexpected: dict[str, int] = field(default_factory=dict)
    error_samples: list[dict[str, Any]] = field(default_factory=list)
    client_failures: list[str] = field(default_factory=list)
    notifications: int = 0
    elapsed: float = 0.0
    clients_connected: int = 0
    login_seconds: float = 0.0
    loadgen_cpu_seconds: float = 0.0
    server_cpu_seconds: float | None = None
    idle_held: int = 0  # --idle sessions open through the run that answered NOOP at its end

    @property
    def total_unexpected(self) -> int:
        return sum(self.unexpected.values())

    def note_error(self, kind: str, command: str, detail: Any) -> None:
        """Keep a few examples of failed replies (at most 3 per command kind, 20 in all)."""
        if len(self.error_samples) >= 20:
            return
        if sum(1 for e in self.error_samples if e["kind"] == kind) < 3:
            self.error_samples.append({"kind": kind, "command": command, "reply": detail})


@dataclass
class _Window:
    start: float
    end: float
    last_done: float = 0.0


async def _client_loop(client: SMQPClient, rng: random.Random, window: _Window, pipeline: int,
                       shape: TreeShape, result: LoadResult) -> None:
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    pending: list[tuple[str, str, Check, float]] = []
    head = 0

    def send_one() -> None:
        kind = rng.choices(kinds, weights)[0]
        line, check = make_command(kind, rng, shape)
        client.write_line(line)
        pending.append((kind, line, check, time.perf_counter()))

    for _ in range(pipeline):
        send_one()
    await client.drain()
    while head < len(pending):
        reply = await asyncio.wait_for(client.read_reply(), REPLY_TIMEOUT)
        done = time.perf_counter()
        kind, line, check, sent = pending[head]
        pending[head] = ("", "", check, 0.0)  # release the line; keep indexes stable
        head += 1
        if sent >= window.start:
            result.samples.add(kind, done - sent, reply.ok)
            window.last_done = max(window.last_done, done)
            if not reply.ok:
                result.note_error(kind, line, reply.lines)
            elif not check(reply):
                result.unexpected[kind] = result.unexpected.get(kind, 0) + 1
                result.note_error(kind, line, {"unexpected": reply.lines})
        if done < window.end:
            send_one()
            await client.drain()
        if head > 4096:  # trim the consumed prefix now and then
            del pending[:head]
            head = 0
    result.notifications += client.notification_count


async def _connect(host: str, port: int, index: int) -> SMQPClient:
    client = await SMQPClient.connect(host, port)
    try:
        await asyncio.wait_for(client.login(f"{USER_PREFIX}{index}", PASSWORD), REPLY_TIMEOUT)
    except BaseException:
        await client.close()
        raise
    return client


async def run_load(host: str, port: int, *, clients: int, seconds: float, warmup: float,
                   pipeline: int, shape: TreeShape, seed_value: int, idle: int = 0,
                   server_cpu: Callable[[], float | None] | None = None) -> LoadResult:
    """Drive ``clients`` concurrent sessions for ``warmup + seconds`` and measure, with
    ``idle`` more logged-in sessions held open and silent all the while."""
    result = LoadResult()
    idlers: list[SMQPClient] = []
    for first in range(0, idle, 100):  # in waves, so logins do not time out
        opened = await asyncio.gather(
            *(_connect(host, port, i % clients) for i in range(first, min(first + 100, idle))),
            return_exceptions=True)
        for item in opened:
            if isinstance(item, SMQPClient):
                idlers.append(item)
            else:
                result.client_failures.append(f"idle session connect/login: {item!r}")
    t0 = time.perf_counter()
    connected = await asyncio.gather(*(_connect(host, port, i) for i in range(clients)),
                                     return_exceptions=True)
    result.login_seconds = time.perf_counter() - t0
    sessions: list[SMQPClient] = []
    for i, item in enumerate(connected):
        if isinstance(item, SMQPClient):
            sessions.append(item)
        else:
            result.client_failures.append(f"client {i} connect/login: {item!r}")
    result.clients_connected = len(sessions)
    if not sessions:
        return result

    start = time.perf_counter() + warmup
    window = _Window(start=start, end=start + seconds)
    marks: dict[str, float | None] = {}

    async def mark_window_start() -> None:
        await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
        marks["cpu"] = time.process_time()
        marks["server"] = server_cpu() if server_cpu else None

    marker = asyncio.create_task(mark_window_start())

    async def one(i: int, client: SMQPClient) -> None:
        rng = random.Random(seed_value * 100_003 + i)
        try:
            await _client_loop(client, rng, window, pipeline, shape, result)
        except Exception as exc:
            result.client_failures.append(f"client {i}: {exc!r}")

    await asyncio.gather(*(one(i, c) for i, c in enumerate(sessions)))
    await marker
    end_cpu = time.process_time()
    end_server = server_cpu() if server_cpu else None
    result.elapsed = max(window.last_done, window.end) - window.start
    if window.last_done == 0.0:
        result.elapsed = 0.0
    result.loadgen_cpu_seconds = end_cpu - (marks.get("cpu") or end_cpu)
    if end_server is not None and marks.get("server") is not None:
        result.server_cpu_seconds = end_server - marks["server"]  # type: ignore[operator]
    if idlers:
        async def still_there(client: SMQPClient) -> bool:
            reply = await asyncio.wait_for(client.command("NOOP"), REPLY_TIMEOUT)
            return reply.ok

        answered = await asyncio.gather(*(still_there(c) for c in idlers),
                                        return_exceptions=True)
        result.idle_held = sum(1 for a in answered if a is True)
        if result.idle_held < idle:
            result.client_failures.append(
                f"{idle - result.idle_held} of {idle} idle sessions lost or silent")
    await asyncio.gather(*(c.quit() for c in [*sessions, *idlers]), return_exceptions=True)
    return result


# ----------------------------------------------------------------------------- reporting

def run_record(backend: str, args: argparse.Namespace, result: LoadResult,
               broker: RunningBroker, seeded: dict[str, int]) -> dict[str, Any]:
    """One backend's figures as a JSON-ready dict."""
    samples = result.samples
    elapsed = result.elapsed
    per_type = {}
    for kind, _ in MIX:
        summary = samples.summary(kind).as_dict()
        summary["unexpected"] = result.unexpected.get(kind, 0)
        summary["per_second"] = summary["count"] / elapsed if elapsed else None
        per_type[kind] = summary
    overall = samples.summary().as_dict()
    return {
        "backend": backend,
        "clients": args.clients,
        "clients_connected": result.clients_connected,
        "idle_sessions": args.idle,
        "idle_sessions_held": result.idle_held,
        "pipeline": args.pipeline,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "elapsed": elapsed,
        "seeded": seeded,
        "total_commands": samples.total,
        "commands_per_second": samples.total / elapsed if elapsed else None,
        "errors": samples.total_errors,
        "unexpected": result.total_unexpected,
        "client_failures": result.client_failures,
        "error_samples": result.error_samples,
        "notifications": result.notifications,
        "overall": overall,
        "per_type": per_type,
        "login_seconds": result.login_seconds,
        "loadgen_cpu_percent": 100 * result.loadgen_cpu_seconds / elapsed if elapsed else None,
        "server_cpu_percent": (100 * result.server_cpu_seconds / elapsed
                               if elapsed and result.server_cpu_seconds is not None else None),
        "server_exit_code": broker.returncode,
        "server_log": str(broker.saved_log) if broker.saved_log else None,
        "server_log_problems": broker.log_problems[:50],
        "server_log_problem_count": len(broker.log_problems),
    }


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def print_run(run: dict[str, Any]) -> None:
    """The per-command table and the headline figures of one backend."""
    idle = (f", {run['idle_sessions_held']}/{run['idle_sessions']} idle sessions held"
            if run.get("idle_sessions") else "")
    title = (f"SMQP commands benchmark, backend {run['backend']}: {run['clients_connected']}/"
             f"{run['clients']} clients{idle}, pipeline {run['pipeline']}, "
             f"{run['elapsed']:.2f} s measured after {run['warmup']:g} s warm-up")
    rows = []
    for kind, s in run["per_type"].items():
        rows.append([kind, s["count"], _num(s["per_second"]), _num(s["mean_ms"]),
                     _num(s["p50_ms"]), _num(s["p99_ms"]), _num(s["max_ms"]), s["errors"],
                     s["unexpected"]])
    o = run["overall"]
    rows.append(["all", o["count"], _num(run["commands_per_second"]), _num(o["mean_ms"]),
                 _num(o["p50_ms"]), _num(o["p99_ms"]), _num(o["max_ms"]), o["errors"],
                 run["unexpected"]])
    print()
    print(title)
    print(format_table(["command", "count", "per s", "mean ms", "p50 ms", "p99 ms", "max ms",
                        "errors", "unexpected"], rows))
    cps = run["commands_per_second"]
    rate = f"{cps:,.1f} commands/s" if cps is not None else "no commands completed"
    print(f"=> {run['total_commands']:,} commands, {rate}, {run['errors']} errors, "
          f"{run['unexpected']} unexpected replies")
    cpu = []
    if run["server_cpu_percent"] is not None:
        cpu.append(f"server {run['server_cpu_percent']:.0f}%")
    if run["loadgen_cpu_percent"] is not None:
        cpu.append(f"load generator {run['loadgen_cpu_percent']:.0f}%")
    if cpu:
        print(f"   CPU (of one core): {', '.join(cpu)}; logins took {run['login_seconds']:.2f} s")
    for failure in run["client_failures"][:10]:
        print(f"   client failure: {failure}")
    for sample in run["error_samples"][:8]:
        print(f"   error: {sample['command']!r} -> {sample['reply']!r}")
    if run["server_log_problem_count"]:
        print(f"   server log: {run['server_log_problem_count']} suspicious lines, e.g.:")
        for line in run["server_log_problems"][:10]:
            print(f"     | {line}")
    if run["server_log"]:
        print(f"   server log kept at {run['server_log']}")
    if run["notifications"]:
        print(f"   {run['notifications']} notifications arrived between replies")


# ----------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``commands`` benchmark."""
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measured duration per backend (default 10)")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds of load before measuring starts (default 1)")
    parser.add_argument("--clients", type=int, default=50,
                        help="concurrent client connections (default 50)")
    parser.add_argument("--db", choices=[*BACKENDS, "both"], default="both",
                        help="database backend(s) to run on (default both)")
    parser.add_argument("--pipeline", type=int, default=1, metavar="K",
                        help="commands each client keeps in flight (default 1)")
    parser.add_argument("--idle", type=int, default=0, metavar="N",
                        help="hold N more logged-in sessions open and silent during the run")
    parser.add_argument("--topics", type=int, default=20, help="first-level topics (20)")
    parser.add_argument("--children", type=int, default=10, help="children per topic (10)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the command mix")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the server logs in bench/results even without problems")
    parser.add_argument("--no-json", action="store_true", help="do not write a results file")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark on each backend; print tables and write the JSON results."""
    if args.clients < 1 or args.pipeline < 1 or args.seconds <= 0:
        raise SystemExit("--clients and --pipeline must be >= 1 and --seconds > 0")
    backends = BACKENDS if args.db == "both" else (args.db,)
    check_services(backends)
    shape = TreeShape(args.topics, args.children)
    stamp = timestamp()
    runs = []
    for backend in backends:
        print(f"[{backend}] preparing an isolated broker (migrate, {args.clients} accounts, "
              f"{shape.topics}x{shape.children} topics) ...", flush=True)
        seeded: dict[str, int] = {}

        def setup(env: BrokerEnv, seeded: dict[str, int] = seeded) -> None:
            seeded.update(seed(env, args.clients, shape))

        with isolated_broker(backend, setup=setup, log_dir=RESULTS_DIR,
                             log_name=f"{stamp}-{NAME}-{backend}-server") as broker:
            broker.keep_log = args.keep_logs
            print(f"[{backend}] runsmqp pid {broker.pid} on {broker.host}:{broker.port}; "
                  f"loading for {args.warmup:g}+{args.seconds:g} s ...", flush=True)
            result = asyncio.run(run_load(
                broker.host, broker.port, clients=args.clients, seconds=args.seconds,
                warmup=args.warmup, pipeline=args.pipeline, shape=shape,
                seed_value=args.seed, idle=args.idle, server_cpu=broker.cpu_seconds,
            ))
            if not broker.alive():
                result.client_failures.append("runsmqp exited during the run")
                broker.keep_log = True
            if result.samples.total_errors or result.total_unexpected or result.client_failures:
                broker.keep_log = True
        run = run_record(backend, args, result, broker, seeded)
        runs.append(run)
        print_run(run)

    if len(runs) > 1:
        print()
        print(format_table(
            ["backend", "commands/s", "p50 ms", "p99 ms", "errors", "unexpected"],
            [[r["backend"], _num(r["commands_per_second"]), _num(r["overall"]["p50_ms"]),
              _num(r["overall"]["p99_ms"]), r["errors"], r["unexpected"]] for r in runs],
        ))
    if not args.no_json:
        payload = {
            "benchmark": NAME,
            "timestamp": stamp,
            "mix": dict(MIX),
            "tree": {"topics": shape.topics, "children": shape.children},
            "args": {k: v for k, v in vars(args).items() if not callable(v)},
            "environment": environment_info(),
            "runs": runs,
        }
        path = write_results(NAME, payload, stamp=stamp)
        print(f"\nresults written to {path}")
    healthy = all(not r["errors"] and not r["unexpected"] and not r["client_failures"]
                  for r in runs)
    return 0 if healthy else 1
