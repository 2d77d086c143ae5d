"""``python -m bench [BENCHMARK] [options]``: run a benchmark (no arguments: every one).

Examples::

    python -m bench                                   # every benchmark, defaults (make bench)
    python -m bench commands --seconds 10 --db both
    python -m bench commands --db postgres --clients 50 --pipeline 4
    python -m bench messages --scenario all --db both    # issue 4, against RabbitMQ too
    python -m bench messages --tls --db sqlite           # the same over SMQPS beside plain
    python -m bench tls                                  # TLS handshakes, failed-login timing
    python -m bench qqp --db both                        # QQP items/s against SMQP publish
    python -m bench selectors --db both                  # selector subscriptions, evaluations/s
    python -m bench rest                                 # REST API against RabbitMQ HTTP
    python -m bench federation --db both                 # forwarded msgs/s, remote latency
    python -m bench reports --events 1000000             # usage report export + PySpark job
    python -m bench xmpp                                 # XMPP/SMQP/RabbitMQ queue workers
    python -m bench queue --items 2000 --rounds 3        # queue drain, every door + peers
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from . import (
    federation,
    messages,
    qqp,
    queue_drain,
    reports,
    rest,
    selectors,
    smqp_load,
    tls,
    xmpp,
)
from .isolated import BrokerSetupError

#: Benchmark name -> module with ``add_arguments(parser)``, ``main(args) -> int`` and a
#: docstring whose first line is the help text. Add further benchmarks here.
BENCHMARKS: dict[str, ModuleType] = {
    "commands": smqp_load,
    "messages": messages,
    "tls": tls,
    "qqp": qqp,
    "selectors": selectors,
    "rest": rest,  # REST publish and pull/ack against RabbitMQ's HTTP API
    "federation": federation,
    "reports": reports,
    "xmpp": xmpp,
    "queue": queue_drain,  # competing consumers at every door, beside RabbitMQ and NATS
}
DEFAULT = "commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="SMQP broker benchmarks. Each starts an isolated broker of its own and "
                    "prints measured figures (and writes them to bench/results/).",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        doc = (module.__doc__ or "").strip().splitlines()
        summary = doc[0] if doc else name
        bench_parser = sub.add_parser(name, help=summary, description=summary)
        module.add_arguments(bench_parser)
        main: Callable[[argparse.Namespace], int] = module.main
        bench_parser.set_defaults(func=main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # `make bench`: every benchmark with its defaults, one after the other
        codes = [main([name]) for name in BENCHMARKS]
        return max(codes)
    # The benchmark name is optional: `python -m bench --seconds 5` runs the default one.
    if argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, DEFAULT)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokerSetupError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
