"""The ``selectors`` benchmark: publish→deliver with 0, 1, 100 and 1,000 selector subscriptions
on one topic, and selector evaluations per second per core.

Part 1 (in this process, one thread, so one core): representative JMS and LDAP selectors are
compiled once and evaluated ``--evaluations`` times each against message views; the figure is
evaluations per CPU second (``time.process_time``).

Part 2 (an isolated broker, ``--db``): one subscriber session (``root``) holds a subscription on
``/bench`` that every message matches (``X_N >= 0``; in the ``0`` scenario a plain one), and
``k - 1`` other accounts each hold a selector on ``/bench`` that no message matches (half JMS,
half LDAP, each text different), so that every message is shown to ``k`` selectors and
delivered once. A publisher pipelines ``--messages`` publishes in windows of ``--window``; the
subscriber ACKs each NOTIFY. The figure is messages delivered (and ACKed) per second, from
the first publish to the last ACK (after an unmeasured warm-up; ``--rounds`` runs of each).

``--worst`` (issue 34 item 2) measures instead the worst selector cost we could construct:
five ``X_A LIKE '%aaa…(990 a)b'`` selectors and a message whose ``X-A`` is 4,000 ``a``. Part 1:
CPU per message to evaluate the five, in this process. Part 2: on an isolated broker where
five accounts hold those selectors on ``/bench``, the time a publish to another topic takes
when sent right after such a message, against the same publish with no such message before it
(the peer figure of the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from .client import SMQPClient
from .isolated import BrokerEnv, check_services, isolated_broker
from .stats import environment_info, format_table, timestamp, write_results

SETUP = (
    "from accounts.models import Account\n"
    "a = Account(username='root', is_superuser=True, is_staff=True)\n"
    "a.set_password('pw')\n"
    "a.save()\n"
    "from topics.models import Topic\n"
    "Topic.objects.create(path='/bench')\n"
)

# Replaces the idle selector subscriptions (k - 1 of them, on accounts idle0000...).
IDLE = """
from accounts.models import Account
from broker.models import Subscription, selector_key
k = {k}
Subscription.objects.filter(account__username__startswith='idle').delete()
have = Account.objects.filter(username__startswith='idle').count()
Account.objects.bulk_create([Account(username=f'idle{{i:04d}}', username_key=f'idle{{i:04d}}')
                            for i in range(have, k)])
ids = list(Account.objects.filter(username__startswith='idle').order_by('username')
           .values_list('pk', flat=True))[:k]
rows = []
for i, pk in enumerate(ids):
    if i % 2:
        cls, text = 'RFC-2254', f'(&(x-region=r{{i}})(x-n>={{i}}))'
    else:
        cls, text = 'JMS', f"X_Region = 'r{{i}}' AND X_N > {{i}}"
    rows.append(Subscription(account_id=pk, resource='MESSAGE', pattern='/bench',
                             pattern_key='/bench', selector_class=cls, selector=text,
                             selector_key=selector_key(cls, text)))
Subscription.objects.bulk_create(rows)
"""

REGIONS = ("emea", "apac", "amer")

EVAL_SELECTORS = [
    ("JMS simple", "JMS", "X_Region = 'emea'"),
    ("JMS typical", "JMS", "X_Region IN ('emea', 'apac') AND X_N BETWEEN 100 AND 5000 "
                           "AND Priority < 3"),
    ("JMS LIKE", "JMS", "Topic LIKE '/stocks/%' AND Name LIKE '%quote%'"),
    ("LDAP simple", "RFC-2254", "(x-region=emea)"),
    ("LDAP typical", "RFC-2254", "(&(|(x-region=emea)(x-region=apac))(x-n>=100)(priority<=2))"),
    ("LDAP substring", "RFC-2254", "(&(topic=/stocks/*)(name=*quote*))"),
]


def _evaluations(count: int) -> list[dict[str, Any]]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    import django

    django.setup()
    from broker.services.selectors import compile_selector, message_view

    views = [message_view(topic=f"/stocks/s{i}", name=f"s{i} quote", priority=i % 3 + 1,
                          headers=[("X-Region", REGIONS[i % 3]), ("X-N", str(i * 37))])
             for i in range(64)]
    results = []
    for label, cls, text in EVAL_SELECTORS:
        selector = compile_selector(cls, text)
        matched = 0
        started = time.process_time()
        for i in range(count):
            matched += selector.matches(views[i & 63])
        cpu = time.process_time() - started
        results.append({"selector": label, "class": cls, "text": text, "evaluations": count,
                        "cpu_seconds": cpu, "per_second": count / cpu if cpu else None,
                        "matched": matched})
    return results


async def _deliver(broker: Any, messages: int, window: int) -> float:
    """Seconds from the first publish to the last ACK of ``messages`` messages."""
    sub = await SMQPClient.connect(broker.host, broker.port)
    pub = await SMQPClient.connect(broker.host, broker.port)
    await sub.login("root", "pw")
    await pub.login("root", "pw")

    async def subscriber() -> None:
        got = 0
        while got < messages:
            line = await sub._line()
            if line.startswith("NOTIFY "):
                note = await sub._read_notification(line)
                if note.kind == "MESSAGE":
                    got += 1
                    sub.write_line("310 ACK")
                    await sub.drain()

    async def publisher() -> None:
        sent = 0
        while sent < messages:
            batch = min(window, messages - sent)
            for i in range(sent, sent + batch):
                body = b"%d" % i
                pub.writer.write(
                    b"PUB MESSAGE /bench c%d\r\nX-Region: %s\r\nX-N: %d\r\n\r\n"
                    b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s\r\n.\r\n"
                    % (i, REGIONS[i % 3].encode(), i, len(body), body))
            await pub.drain()
            for _ in range(batch):
                reply = await pub.read_reply()
                if not reply.ok:
                    raise RuntimeError(f"publish refused: {reply.lines}")
            sent += batch

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(subscriber(), publisher()), timeout=600)
    elapsed = time.perf_counter() - started
    await sub.quit()
    await pub.quit()
    return elapsed


HOSTILE_PATTERN = "%" + "a" * 990 + "b"
HOSTILE_TEXT = "a" * 4000
HOSTILE = """
from accounts.models import Account
from broker.models import Subscription, selector_key
from topics.models import Topic
from ual.models import UALEntry
Topic.objects.get_or_create(path='/benchother')
UALEntry.objects.get_or_create(topic=Topic.objects.get(path='/bench'), principal_kind='everyone',
                               right='subscribe')
for i in range(5):
    a, _ = Account.objects.get_or_create(username=f'hostile{i}', username_key=f'hostile{i}')
    text = PATTERN_SELECTOR + f' AND X_I >= {i}'
    Subscription.objects.get_or_create(account=a, resource='MESSAGE', pattern='/bench',
                                       pattern_key='/bench', selector_class='JMS',
                                       selector=text, selector_key=selector_key('JMS', text))
""".replace("PATTERN_SELECTOR", repr(f"X_A LIKE '{HOSTILE_PATTERN}'"))


def _worst_evaluation(rounds: int) -> list[float]:
    """CPU seconds to show one hostile message to the five hostile selectors, per round."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    import django

    django.setup()
    from broker.services.selectors import compile_selector, message_view

    selectors = [compile_selector("JMS", f"X_A LIKE '{HOSTILE_PATTERN}' AND X_I >= {i}")
                 for i in range(5)]
    view = message_view(topic="/bench", headers=[("X-A", HOSTILE_TEXT), ("X-I", "9")])
    out = []
    for _ in range(rounds):
        started = time.process_time()
        for selector in selectors:
            selector.matches(view)
        out.append(time.process_time() - started)
    return out


async def _unrelated_publish(broker: Any, rounds: int) -> list[tuple[float, float, float]]:
    """(seconds of a publish to /benchother alone, the same right after a hostile publish
    to /bench, the hostile publish itself), per round."""
    hostile = await SMQPClient.connect(broker.host, broker.port)
    other = await SMQPClient.connect(broker.host, broker.port)
    await hostile.login("root", "pw")
    await other.login("root", "pw")

    async def timed(cmuid: str) -> float:
        started = time.perf_counter()
        other.writer.write(b"PUB MESSAGE /benchother %s\r\n\r\n"
                           b"Content-Type: text/plain\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n"
                           % cmuid.encode())
        await other.drain()
        reply = await other.read_reply()
        if not reply.ok:
            raise RuntimeError(f"publish refused: {reply.lines}")
        return time.perf_counter() - started

    out = []
    for r in range(rounds):
        alone = await timed(f"alone{r}")
        started = time.perf_counter()
        hostile.writer.write(
            b"PUB MESSAGE /bench h%d\r\nX-A: %s\r\nX-I: 9\r\n\r\n"
            b"Content-Type: text/plain\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n"
            % (r, HOSTILE_TEXT.encode()))
        await hostile.drain()
        await asyncio.sleep(0.05)  # the hostile publish reaches the listener first
        after = await timed(f"after{r}")
        await hostile.read_reply()
        out.append((alone, after, time.perf_counter() - started))
    await hostile.quit()
    await other.quit()
    return out


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    return f"median {mid * 1000:.1f} ms (min {ordered[0] * 1000:.1f}, max {ordered[-1] * 1000:.1f})"


def worst(args: argparse.Namespace) -> int:
    cpu = _worst_evaluation(args.rounds)
    print(f"five hostile LIKE selectors x one 4,000-char X-A, CPU per message: {_spread(cpu)}")
    sys.stdout.flush()
    backends = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    check_services(backends)
    runs = []
    for backend in backends:
        with isolated_broker(backend, setup=lambda b: (b.run_python(SETUP),
                                                       b.run_python(HOSTILE))) as broker:
            triples = asyncio.run(_unrelated_publish(broker, args.rounds))
            alone, after, own = ([t[i] for t in triples] for i in range(3))
            print(f"{backend:8} unrelated publish alone: {_spread(alone)}")
            print(f"{backend:8} right after a hostile one: {_spread(after)}")
            print(f"{backend:8} the hostile publish itself: {_spread(own)}")
            runs.append({"backend": backend, "alone_seconds": alone, "after_seconds": after,
                         "hostile_seconds": own})
    record = {"benchmark": "selectors-worst", "when": timestamp(),
              "environment": environment_info(), "cpu_seconds": cpu, "runs": runs}
    print(f"results: {write_results('selectors', record)}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worst", action="store_true",
                        help="the worst-case LIKE selector figures instead (see above)")
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="postgres")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--window", type=int, default=100, help="publishes per pipeline window")
    parser.add_argument("--evaluations", type=int, default=200_000)
    parser.add_argument("--scenarios", default="0,1,100,1000",
                        help="numbers of selector subscriptions (0: one plain subscription)")
    parser.add_argument("--warmup", type=int, default=500,
                        help="messages delivered, unmeasured, before the first scenario")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every scenario")


def main(args: argparse.Namespace) -> int:
    if args.worst:
        return worst(args)
    evals = _evaluations(args.evaluations)
    print(format_table(["selector", "evaluations/s (one core)"],
                       [(e["selector"], f"{e['per_second']:,.0f}") for e in evals]))
    sys.stdout.flush()
    backends = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    check_services(backends)
    scenarios = [int(k) for k in args.scenarios.split(",")]
    runs = []
    for backend in backends:
        with isolated_broker(backend, setup=lambda b: b.run_python(SETUP)) as broker:
            if args.warmup:
                _prepare(broker, 0)
                asyncio.run(_deliver(broker, args.warmup, args.window))
            for round_ in range(args.rounds):
                for k in scenarios:
                    _prepare(broker, k)
                    elapsed = asyncio.run(_deliver(broker, args.messages, args.window))
                    rate = args.messages / elapsed
                    runs.append({"backend": backend, "selector_subscriptions": k,
                                 "round": round_, "messages": args.messages,
                                 "seconds": elapsed, "delivered_per_second": rate})
                    print(f"{backend:8} round {round_} {k:5} selector subscriptions: "
                          f"{rate:8.1f} msg/s published→delivered→ACKed "
                          f"({args.messages} in {elapsed:.2f} s)")
                    sys.stdout.flush()
    record = {"benchmark": "selectors", "when": timestamp(), "environment": environment_info(),
              "evaluations": evals, "runs": runs}
    print(f"results: {write_results('selectors', record)}")
    return 0


def _prepare(broker: BrokerEnv, k: int) -> None:
    """root's own subscription (a selector matching everything; plain for k = 0) and the
    k - 1 idle selector subscriptions."""
    own = "" if k == 0 else "selector_class='JMS', selector='X_N >= 0', "
    broker.run_python(
        "from accounts.models import Account\n"
        "from broker.models import Subscription\n"
        "root = Account.objects.get(username='root')\n"
        "Subscription.objects.filter(account=root).delete()\n"
        f"Subscription.objects.create(account=root, resource='MESSAGE', pattern='/bench', "
        f"{own})\n" + IDLE.format(k=max(k - 1, 0)))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(argparse.ArgumentParser().parse_args()))
