"""``python -m bench.cluster``: publish and queue-drain throughput on the local cluster
(``make cluster``) with its broker nodes used 1, 2 and 3 at a time. Clients connect to the
nodes directly (spread evenly), so a round with one node measures one node, not HAProxy.
Every node shares the machine's cores with PostgreSQL, Redis and the clients: on a small
machine the cores decide, not the number of nodes (say so when you report figures).

Rounds: for each node count, ``--seconds`` of pipelined publishes to the queue topic /jobs
(``--publishers`` sessions), then as long of queue drain by 2 consumer sessions per node
(ACKs/s); the median and spread over ``--rounds`` are printed. The accounts and topics are those of
tests/support/cluster_load.py (SETUP)."""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from deploy.local import NODE_PORTS, LocalCluster
from tests.support.cluster_load import SETUP
from tests.support.queue_clients import ack_answer, smuid_in
from tests.support.smqp_session import Session

PIPELINE = 50


def publish_round(addrs: list[str], publishers: int, seconds: float) -> int:
    stop = time.monotonic() + seconds
    counts = [0] * publishers

    def run(i: int) -> None:
        with Session(addrs[i % len(addrs)], NODE_PORTS["smqp"], "pub", timeout=60) as s:
            while time.monotonic() < stop:
                for n in range(PIPELINE):
                    s.send_publish("/jobs", f"b{i}-{n}")
                counts[i] += sum(s.reply().code == 200 for _ in range(PIPELINE))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def drain_round(addrs: list[str], seconds: float) -> float:
    """Queue messages ACKed per second by 2 consumers per node over ``seconds`` (the
    backlog the publish rounds left is larger than that)."""
    done = threading.Event()
    acked = [0]
    lock = threading.Lock()
    started = threading.Event()

    def run(i: int) -> None:
        with Session(addrs[i % len(addrs)], NODE_PORTS["smqp"], f"q{i % 4}", timeout=60) as s:
            assert s.command("SUB MESSAGE /jobs").code == 200
            started.wait()
            while not done.is_set():
                try:
                    smuid_in(s.message(timeout=1))
                except TimeoutError:
                    continue
                if ack_answer(s) == 310:
                    with lock:
                        acked[0] += 1

    threads = [threading.Thread(target=run, args=(i,), daemon=True)
               for i in range(2 * len(addrs))]
    for t in threads:
        t.start()
    time.sleep(2)  # every consumer logged in and subscribed
    with lock:
        acked[0] = 0
    started.set()
    time.sleep(seconds)
    with lock:
        rate = acked[0] / seconds
    done.set()
    for t in threads:
        t.join(timeout=10)
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=6)
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    cluster._load()
    if not cluster.procs:
        print("no local cluster: make cluster first", file=sys.stderr)
        return 1
    cluster.manage("shell", "--no-imports", "-c", SETUP)
    for count in (1, 2, 3):
        addrs = [n.addr for n in cluster.nodes[:count]]
        pub_rates, drain_rates = [], []
        for _ in range(args.rounds):
            n = publish_round(addrs, args.publishers, args.seconds)
            pub_rates.append(n / args.seconds)
            drain_rates.append(drain_round(addrs, args.seconds))
        print(f"{count} node(s): publish {statistics.median(pub_rates):.0f} msg/s "
              f"(min {min(pub_rates):.0f}, max {max(pub_rates):.0f}); queue drain "
              f"{statistics.median(drain_rates):.0f} msg/s (min {min(drain_rates):.0f}, "
              f"max {max(drain_rates):.0f}); {args.rounds} rounds of {args.seconds:g} s")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
