"""The ``tls`` benchmark: SMQPS handshakes per second, and failed logins' indistinguishability.

It starts an isolated broker (SQLite) with a test certificate made by ``trustme`` and the
account ``bob`` (password ``pw``), then measures:

* **Connections per second**, plain TCP and SMQPS: ``--clients`` concurrent loops, each
  connecting, reading the greeting and closing, for ``--seconds``. On SMQPS every connection
  is a full TLS handshake (no session resumption), so the ratio is the handshake's cost.
* **Failed logins**: an unknown account and a wrong password, alternated ``--logins`` times
  each, over CLEAR (``PASS``) and SCRAM-SHA-256 (the whole exchange): the replies must be the
  same bytes, and the medians of their times are printed side by side (a figure to read, not
  a pass/fail test; the throttle of repeated failures is switched off for the run).

Publish and end-to-end throughput over SMQPS: ``python -m bench messages --tls``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time
from typing import Any

from .client import SMQPClient
from .isolated import BrokerEnv, check_services, isolated_broker
from .messages import smqps_port, test_certificate
from .stats import RESULTS_DIR, environment_info, timestamp, write_results

NAME = "smqp-tls"


async def connection_rate(host: str, port: int, ca: str, clients: int,
                          seconds: float) -> float:
    """Connections (connect, greeting, close) per second over ``clients`` loops."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            client = await SMQPClient.connect(host, port, tls_ca=ca)
            await client.close()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return done / (time.perf_counter() - start)


async def clear_failure(host: str, port: int, user: str) -> tuple[float, str]:
    client = await SMQPClient.connect(host, port)
    try:
        await client.command(f"LOGIN {user} CLEAR/1.0")
        start = time.perf_counter()
        reply = await client.command(f"PASS {user} wrong-password")
        return time.perf_counter() - start, "|".join(reply.lines)
    finally:
        await client.close()


async def scram_failure(host: str, port: int, user: str) -> tuple[float, str]:
    from accounts.scram import ScramClient

    client = await SMQPClient.connect(host, port)
    try:
        start = time.perf_counter()
        await client.command(f"LOGIN {user} SCRAM-SHA-256/1.0")
        scram = ScramClient(user, "wrong-password")
        await client.send_line(base64.b64encode(scram.first()).decode())
        challenge = (await client.reader.readline()).decode().strip()
        await client.send_line(
            base64.b64encode(scram.final(base64.b64decode(challenge[2:]))).decode())
        reply = await client.read_reply()
        return time.perf_counter() - start, "|".join(reply.lines)
    finally:
        await client.close()


async def failed_logins(host: str, port: int, rounds: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for method, attempt in (("CLEAR", clear_failure), ("SCRAM-SHA-256", scram_failure)):
        times: dict[str, list[float]] = {"unknown": [], "wrong": []}
        replies: dict[str, set[str]] = {"unknown": set(), "wrong": set()}
        for _ in range(rounds):
            for case, user in (("unknown", "nosuchuser"), ("wrong", "bob")):
                elapsed, reply = await attempt(host, port, user)
                times[case].append(elapsed)
                replies[case].add(reply)
        figures[method] = {
            "median_ms_unknown": 1000 * statistics.median(times["unknown"]),
            "median_ms_wrong": 1000 * statistics.median(times["wrong"]),
            "replies_unknown": sorted(replies["unknown"]),
            "replies_wrong": sorted(replies["wrong"]),
            "same_replies": replies["unknown"] == replies["wrong"],
        }
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="seconds per connection-rate run (default 5)")
    parser.add_argument("--clients", type=int, default=8,
                        help="concurrent connecting loops (default 8)")
    parser.add_argument("--logins", type=int, default=30,
                        help="failed logins per case and method (default 30)")
    parser.add_argument("--no-json", action="store_true", help="do not write a results file")


def main(args: argparse.Namespace) -> int:
    check_services(("sqlite",))
    stamp = timestamp()

    def setup(env: BrokerEnv) -> None:
        env.manage("createaccount", "bob", "--password", "pw")

    quiet = {"SMQP_LOGIN_FAILURES_BEFORE_DELAY": "1000000",
             "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "1000000"}
    with test_certificate() as (ca, tls_env), isolated_broker(
            "sqlite", setup=setup, log_dir=RESULTS_DIR, log_name=f"{stamp}-{NAME}-server",
            extra_env={**tls_env, **quiet}) as broker:
        tls_port = smqps_port(broker)
        host = broker.host
        plain = asyncio.run(connection_rate(host, broker.port, "", args.clients, args.seconds))
        tls = asyncio.run(connection_rate(host, tls_port, ca, args.clients, args.seconds))
        logins = asyncio.run(failed_logins(host, broker.port, args.logins))
    print(f"connections/s, {args.clients} clients: plain {plain:,.0f}, SMQPS {tls:,.0f} "
          f"({tls / plain:.0%} of plain)")
    for method, fig in logins.items():
        print(f"failed {method} login, median ms: unknown account "
              f"{fig['median_ms_unknown']:.2f}, wrong password {fig['median_ms_wrong']:.2f}; "
              f"replies {'identical' if fig['same_replies'] else 'DIFFER'}: "
              f"{fig['replies_unknown']}")
    if not args.no_json:
        path = write_results(NAME, {
            "benchmark": NAME, "timestamp": stamp, "args": vars(args) | {"func": None},
            "environment": environment_info(),
            "connections_per_second": {"plain": plain, "smqps": tls},
            "failed_logins": logins,
        }, stamp=stamp)
        print(f"results written to {path}")
    return 0 if all(fig["same_replies"] for fig in logins.values()) else 1
