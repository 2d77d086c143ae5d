"""The ``rest`` benchmark: REST publish and pull→ack against RabbitMQ's HTTP API publish.

It starts an isolated broker (``runsmqp``, whose dispatcher the REST publishes wake) and a
Daphne serving the REST API beside it on the same database, with the superuser ``root``
(a bearer token from ``manage.py token``) subscribed to ``/bench``. Then:

* publish: ``--clients`` threads (8), each with its own keep-alive HTTP connection (httpx),
  POST one ``--size``-byte message (256) at a time to ``/api/v1/topics/bench/messages`` and
  wait for its ``201`` (sent after the commit), for ``--seconds``;
* pull→ack: the same threads pull up to ``--batch`` (10) of the messages just published
  (``POST /api/v1/subscriptions/{id}/pull``) and ACK each by its receipt, until none is left
  or ``--seconds`` pass;
* RabbitMQ: the same threads POST to the management plugin's
  ``/api/exchanges/%2F/amq.default/publish`` (a queue of its own, routed: true), for
  ``--seconds``: the reference for "publish over HTTP".

Figures: requests per second and p50/p99 latency of each. The client is Python threads
(one process): on a small machine it takes CPU from the servers it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import httpx

from .isolated import ROOT, BrokerEnv, BrokerSetupError, check_services, isolated_broker
from .profiling import PySpy, format_summary, summarize_collapsed
from .stats import RESULTS_DIR, Samples, environment_info, format_table, timestamp, write_results

SETUP = """
from accounts.models import Account
from broker.models import Subscription
from broker.services import topics as ts
from ual.resolution import AccessSnapshot
root = Account(username='root', is_superuser=True, is_staff=True)
root.set_password('pw')
root.save()
ts.create_topic(AccessSnapshot(root), '/bench')
Subscription.objects.create(account=root, resource='MESSAGE', pattern='/bench')
"""
RABBIT = "http://127.0.0.1:15672"
RABBIT_AUTH = ("guest", "guest")


def _start_daphne(broker: BrokerEnv, workers: int = 1) -> tuple[list[subprocess.Popen], str]:
    """``workers`` Daphne processes accepting on one listening socket (``--fd``)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    procs = []
    for i in range(workers):
        log = (broker.var_dir / f"daphne-{i}.log").open("wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(listener.fileno()),
             "broker.asgi_server:application"], env=broker.env, cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, pass_fds=(listener.fileno(),)))
    listener.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/schema/", timeout=5).status_code == 200:
                return procs, url
        except httpx.HTTPError:
            pass
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.3)
    for p in procs:
        p.kill()
    raise BrokerSetupError("daphne did not start")


def _run(clients: int, seconds: float, make: Callable[[int], Callable[[], bool | None]],
         kind: str) -> tuple[Samples, float]:
    """Each of ``clients`` threads calls its function until ``seconds`` pass or it returns
    None (nothing left); every call's latency and success go into the samples."""
    samples = [Samples() for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    stop = [float("inf")]
    last = [0.0] * clients  # when each thread's last counted call ended

    def loop(i: int) -> None:
        one = make(i)
        barrier.wait()
        while time.monotonic() < stop[0]:
            t0 = time.perf_counter()
            ok = one()
            if ok is None:
                return
            samples[i].add(kind, time.perf_counter() - t0, ok)
            last[i] = time.monotonic()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.monotonic()
    stop[0] = began + seconds
    for t in threads:
        t.join(seconds + 120)
    # Up to the last counted call: a thread that found nothing left stops counting there.
    elapsed = max(last) - began if max(last) > began else time.monotonic() - began
    total = Samples()
    for s in samples:
        total.merge(s)
    return total, elapsed


def _rest_publish(url: str, token: str, size: int,
                  batch: int = 0) -> Callable[[int], Callable[[], bool]]:
    """One publish per call, or with ``batch`` a list of that many messages per call."""
    one = {"sections": [{"text": "x" * size}]}
    body: dict | list = [one] * batch if batch else one

    def make(i: int) -> Callable[[], bool]:
        client = httpx.Client(base_url=url, timeout=60,
                              headers={"Authorization": f"Bearer {token}"})
        return lambda: client.post("/api/v1/topics/bench/messages", json=body).status_code \
            == 201
    return make


def _rest_pull_ack(url: str, token: str, sub: int, batch: int, acked: list[int],
                   target: int) -> Callable[[int], Callable[[], bool | None]]:
    def make(i: int) -> Callable[[], bool | None]:
        client = httpx.Client(base_url=url, timeout=60,
                              headers={"Authorization": f"Bearer {token}"})
        pending: list[str] = []

        def one() -> bool | None:
            # One call is one request: a pull (when no receipt is waiting) or one ACK.
            if not pending:
                reply = client.post(f"/api/v1/subscriptions/{sub}/pull",
                                    json={"max": batch, "wait_seconds": 0})
                got = reply.json().get("messages", []) if reply.status_code == 200 else []
                if reply.status_code == 200 and not got and sum(acked) >= target:
                    return None  # all consumed (an empty pull alone: others hold the rest)
                pending.extend(m["receipt"] for m in got)
                return reply.status_code == 200
            ok = client.post(f"/api/v1/receipts/{pending.pop()}/ack").status_code == 204
            if ok:
                acked[i] += 1
            return ok
        return one
    return make


def _rabbit_publish(queue: str, size: int) -> Callable[[int], Callable[[], bool]]:
    body = {"properties": {}, "routing_key": queue, "payload": "x" * size,
            "payload_encoding": "string"}

    def make(i: int) -> Callable[[], bool]:
        client = httpx.Client(base_url=RABBIT, auth=RABBIT_AUTH, timeout=60)

        def one() -> bool:
            reply = client.post("/api/exchanges/%2F/amq.default/publish", json=body)
            return reply.status_code == 200 and reply.json().get("routed") is True
        return one
    return make


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--size", type=int, default=256, help="payload bytes per message")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=10, help="messages per pull")
    parser.add_argument("--publish-batch", type=int, default=50,
                        help="messages per batch publish request (0: no batch publish run)")
    parser.add_argument("--profile", action="store_true",
                        help="sample Daphne with py-spy during the single-publish run (slows "
                             "it down: take figures from a run without it)")
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--http-workers", type=int, default=1,
                        help="Daphne processes accepting on the one port")


def _row(name: str, samples: Samples, elapsed: float, kind: str) -> list:
    s = samples.summary(kind)
    return [name, s.count, s.errors, f"{s.count / elapsed:.0f}", f"{s.p50_ms:.1f}",
            f"{s.p99_ms:.1f}"]


def main(args: argparse.Namespace) -> int:
    check_services((args.db,))
    results: dict = {}
    rows = []
    with isolated_broker(args.db, setup=lambda b: b.run_python(SETUP)) as broker:
        daphnes, url = _start_daphne(broker, args.http_workers)
        daphne = daphnes[0]
        try:
            token = broker.manage("token", "create", "root", "bench").stdout.strip()
            sub = httpx.get(url + "/api/v1/subscriptions/", headers={
                "Authorization": f"Bearer {token}"}).json()["results"][0]["id"]
            # Warm: the first publish starts Daphne's storage processes and dispatcher (each
            # new connection may reach another of the Daphne processes).
            for _ in range(4 * args.http_workers):
                httpx.post(url + "/api/v1/topics/bench/messages", timeout=120, json={
                    "sections": [{"text": "warm"}]}, headers={"Authorization": f"Bearer {token}"},
                ).raise_for_status()
            profiler = (PySpy(daphne.pid, RESULTS_DIR / f"{timestamp()}-profile-rest.txt",
                              args.seconds) if args.profile else None)
            if profiler is not None and not profiler.start():
                print(f"profile: {profiler.error}", file=sys.stderr)
                profiler = None
            published, elapsed = _run(args.clients, args.seconds,
                                      _rest_publish(url, token, args.size), "publish")
            if profiler is not None:
                if profiler.wait():
                    results["profile"] = summarize_collapsed(profiler.output, top=30)
                    print(format_summary(results["profile"], top=30))
                else:
                    print(f"profile: {profiler.error}", file=sys.stderr)
            rows.append(_row("REST publish", published, elapsed, "publish"))
            results["rest_publish"] = {**published.summary("publish").as_dict(),
                                       "per_second": published.summary("publish").count
                                       / elapsed}
            if args.publish_batch:
                batched, elapsed_b = _run(args.clients, args.seconds, _rest_publish(
                    url, token, args.size, args.publish_batch), "publish")
                summary = batched.summary("publish")
                rows.append(_row(f"REST batch publish requests ({args.publish_batch} each)",
                                 batched, elapsed_b, "publish"))
                rows.append(["REST messages batch-published",
                             summary.count * args.publish_batch, "",
                             f"{summary.count * args.publish_batch / elapsed_b:.0f}", "", ""])
                results["rest_publish_batch"] = {
                    **summary.as_dict(), "batch": args.publish_batch,
                    "messages_per_second": summary.count * args.publish_batch / elapsed_b}
            acked = [0] * args.clients
            pulled, elapsed = _run(args.clients, max(args.seconds, 30.0),
                                   _rest_pull_ack(url, token, sub, args.batch, acked,
                                                  published.summary("publish").count),
                                   "call")
            rows.append(_row("REST pull+ack requests", pulled, elapsed, "call"))
            rows.append(["REST messages acked", sum(acked), "", f"{sum(acked) / elapsed:.0f}",
                         "", ""])
            results["rest_pull_ack"] = {**pulled.summary("call").as_dict(),
                                        "requests_per_second": pulled.summary("call").count
                                        / elapsed,
                                        "acked": sum(acked),
                                        "acked_per_second": sum(acked) / elapsed}
        finally:
            for proc in daphnes:
                proc.terminate()
            for proc in daphnes:
                proc.wait(30)
    if not args.no_rabbitmq:
        queue = f"bench-rest-{uuid.uuid4().hex[:8]}"
        try:
            httpx.put(f"{RABBIT}/api/queues/%2F/{queue}", auth=RABBIT_AUTH,
                      json={"durable": False, "auto_delete": False}).raise_for_status()
            rabbit, elapsed = _run(args.clients, args.seconds,
                                   _rabbit_publish(queue, args.size), "publish")
            rows.append(_row("RabbitMQ HTTP publish", rabbit, elapsed, "publish"))
            results["rabbitmq_http_publish"] = {**rabbit.summary("publish").as_dict(),
                                                "per_second": rabbit.summary("publish").count
                                                / elapsed}
        except httpx.HTTPError as exc:
            print(f"RabbitMQ's management API is not reachable ({exc}): "
                  "rabbitmq-plugins enable rabbitmq_management", file=sys.stderr)
        finally:
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{RABBIT}/api/queues/%2F/{queue}", auth=RABBIT_AUTH)
    print(format_table(["what", "count", "errors", "per second", "p50 ms", "p99 ms"], rows))
    record = {"benchmark": "rest", "when": timestamp(), "environment": environment_info(),
              "settings": {k: v for k, v in vars(args).items() if k != "func"},
              "results": results}
    path = write_results("rest", record)
    print(f"written to {path}")
    return 0

