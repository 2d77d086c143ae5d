"""A generated day of usage events for the report tests, and the report computed from it in
plain Python (independently of Spark), to compare with the job's exactly.

Run inside Django (the ORM or a ``manage.py shell`` of a test server): :func:`insert` writes the
events with their own times (the model's ``auto_now_add`` would overwrite them).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

ACCOUNTS = ("alice", "bob", "carol", "dave")
TOPICS = ("/a", "/a/b", "/a/b/c", "/a/d", "/x/y", "/x/z/w")
REASONS = ("max retries", "no longer allowed")
METRICS = ("published", "delivered", "acked", "expired", "dead", "republished", "bytes_in",
           "bytes_out")


@dataclass
class Event:
    at: datetime
    kind: str
    account: str = ""
    topic: str = ""
    smuid: int | None = None
    bytes: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def generate(day: date, publishes: int = 600, seed: int = 25,
             account_ids: dict[str, int] | None = None) -> list[Event]:
    """Events of ``day`` and, to be left out or only joined with, of the days around it."""
    rnd = random.Random(seed)
    start = day_start(day)
    ids = account_ids or {name: i + 1 for i, name in enumerate(ACCOUNTS)}
    events: list[Event] = []

    def when(lo: float = 0, hi: float = 86_400) -> datetime:
        return start + timedelta(microseconds=rnd.randrange(int(lo * 1e6), int(hi * 1e6)))

    smuid = 1000
    # Publishes of the day before, ACKed, expired or dead today (the prior-day join).
    for _ in range(40):
        smuid += 1
        at = start - timedelta(seconds=rnd.randrange(1, 50_000))
        events.append(Event(at, "publish", rnd.choice(ACCOUNTS), rnd.choice(TOPICS), smuid,
                            rnd.randrange(1, 5000), {"door": "smqp", "to": 1}))
        kind = rnd.choice(("ack", "ack", "expire", "dead"))
        later = when(0, 7200)
        if kind == "ack":
            events.append(Event(later, "ack", rnd.choice(ACCOUNTS), "", smuid))
        elif kind == "expire":
            events.append(Event(later, "expire", smuid=smuid))
        else:
            events.append(Event(later, "dead", smuid=smuid,
                                detail={"account_id": ids[rnd.choice(ACCOUNTS)],
                                        "reason": rnd.choice(REASONS)}))
    for _ in range(publishes):
        smuid += 1
        at = when(0, 86_000)
        topic, publisher = rnd.choice(TOPICS), rnd.choice(ACCOUNTS)
        to = rnd.randrange(0, 4)
        size = rnd.randrange(0, 100_000)
        door = rnd.choice(("smqp", "smqp", "qqp", "rest", "xmpp", "console", "federation"))
        events.append(Event(at, "publish", publisher, topic, smuid, size,
                            {"door": door, "to": to}))
        for receiver in rnd.sample(ACCOUNTS, to):
            fate = rnd.random()
            later = at + timedelta(milliseconds=rnd.randrange(1, 600_000))
            if fate < 0.7:  # maybe tomorrow; from an SMQP, XMPP or REST session, or untold
                ack_door = rnd.choice(("smqp", "xmpp", "rest", None))
                events.append(Event(later, "ack", receiver, "", smuid,
                                    detail={"door": ack_door} if ack_door else {}))
            elif fate < 0.8:
                events.append(Event(later, "dead", smuid=smuid,
                                    detail={"account_id": ids[receiver],
                                            "reason": rnd.choice(REASONS)}))
        if rnd.random() < 0.05:  # the sweep: smuid only
            events.append(Event(at + timedelta(seconds=30), "expire", smuid=smuid))
        elif rnd.random() < 0.03:  # REMOVE MESSAGES: who, where
            events.append(Event(at + timedelta(seconds=5), "expire", publisher, topic, smuid,
                                detail={"removed": True}))
        if rnd.random() < 0.02:
            events.append(Event(at + timedelta(seconds=60), "republish", publisher, topic,
                                smuid, size))
    # An ACK of a message whose publish is not known (older than the retention).
    events.append(Event(when(), "ack", "alice", "", 999_999))
    # Sessions and subscriptions, each login before its logout.
    for i in range(60):
        a = when(0, 80_000)
        name = rnd.choice(ACCOUNTS)
        events.append(Event(a, "login", name, detail={"guid": f"{name}{i:04d}"}))
        if rnd.random() < 0.8:
            events.append(Event(a + timedelta(seconds=rnd.randrange(1, 6000)), "logout",
                                name, detail={"guid": f"{name}{i:04d}"}))
    for i in range(30):
        a = when(0, 80_000)
        events.append(Event(a, "subscribe", rnd.choice(ACCOUNTS), f"/sub{i}"))
        if rnd.random() < 0.5:
            events.append(Event(a + timedelta(seconds=rnd.randrange(1, 6000)), "unsubscribe",
                                rnd.choice(ACCOUNTS), f"/sub{i}",
                                detail={"created": a.isoformat()}))
    # The boundaries: the last microsecond of the day before, the first of the next day.
    smuid += 1
    events.append(Event(start - timedelta(microseconds=1), "login", "bob"))
    events.append(Event(start + timedelta(days=1), "publish", "bob", "/a", smuid, 7,
                        {"door": "smqp", "to": 1}))
    events.append(Event(start, "login_failed", "mallory"))
    return events


def insert(events: list[Event]) -> None:
    """Write the events (inside Django) with their own times."""
    from django.db import transaction

    from broker.store.messages import EVENTS
    from broker.store.rows import db_datetime

    with transaction.atomic():
        EVENTS.insert([(db_datetime(e.at), e.kind, e.account, e.topic, e.smuid, e.bytes, "",
                        json.dumps(e.detail)) for e in events])


def expected(events: list[Event], day: date, names: dict[int, str],
             sessions_at_start: int = 0, subscribers_at_start: int = 0) -> dict[str, Any]:
    """The report of ``day``, in plain Python: the job's result shape, lists sorted."""
    start = day_start(day)
    end = start + timedelta(days=1)
    today = [e for e in events if start <= e.at < end]
    pubs = {e.smuid: e for e in events if e.kind == "publish" and e.at < end}
    usage: dict[tuple[str, str, int | None], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(METRICS, 0))
    latency: dict[str, list[float]] = defaultdict(list)
    dead: dict[tuple[str, str], int] = defaultdict(int)
    for e in today:
        if e.kind not in ("publish", "republish", "ack", "expire", "dead"):
            continue
        pub = pubs.get(e.smuid)
        topic = e.topic or (pub.topic if pub else "") or "(unknown)"
        door = e.detail.get("door") or "smqp"
        if e.kind in ("expire", "dead"):
            door = (pub.detail.get("door") if pub else None) or "smqp"
        if e.kind == "dead":
            account = names[e.detail["account_id"]]
        elif e.kind == "expire":
            account = pub.account if pub else e.account
        else:
            account = e.account
        add = dict.fromkeys(METRICS, 0)
        if e.kind == "publish":
            add.update(published=1, delivered=e.detail.get("to", 0), bytes_in=e.bytes)
        elif e.kind == "ack":
            add.update(acked=1, bytes_out=pub.bytes if pub else 0)
            if pub:
                ms = (e.at - pub.at) / timedelta(microseconds=1) / 1000
                latency[topic].append(ms)
                latency[""].append(ms)
        elif e.kind == "expire":
            add["expired"] = 1
        elif e.kind == "dead":
            add["dead"] = 1
            dead[(e.detail["reason"], topic)] += 1
        else:
            add["republished"] = 1
        parts = topic.split("/")
        subtrees = ["/".join(parts[:i]) for i in range(2, len(parts) + 1)] \
            if topic.startswith("/") else [topic]
        keys = [("total", ""), ("account", account), ("door", door), ("topic", topic)] + \
            [("subtree", s) for s in subtrees]
        for dim, key in keys:
            for hour in (e.at.hour, None):
                row = usage[(dim, key, hour)]
                for m in METRICS:
                    row[m] += add[m]

    def peaks(up: str, down: str, level: int) -> dict[str, Any]:
        hours = []
        ordered = sorted((e for e in today if e.kind in (up, down)), key=lambda e: e.at)
        for hour in range(24):
            peak = level
            for e in ordered:
                if e.at.hour == hour:
                    level += 1 if e.kind == up else -1
                    peak = max(peak, level)
            hours.append(peak)
        return {"day": max(hours), "hours": hours, "end": level}

    day_rows = [(k, v) for k, v in usage.items() if k[2] is None]
    top = []
    ranked = {
        "topic": sorted(((v["published"], k[1]) for k, v in day_rows if k[0] == "topic"),
                        key=lambda t: (-t[0], t[1])),
        "account": sorted(((v["published"] + v["acked"], k[1]) for k, v in day_rows
                           if k[0] == "account" and k[1]), key=lambda t: (-t[0], t[1])),
    }
    for what, items in ranked.items():
        for rank, (value, key) in enumerate([i for i in items if i[0] > 0][:10], 1):
            top.append({"what": what, "rank": rank, "key": key, "value": value})
    return {
        "events": len(today),
        "usage": sorted(({"dim": d, "key": k, "hour": h, **v}
                         for (d, k, h), v in usage.items()), key=usage_key),
        "latency": {t: sorted(v) for t, v in latency.items()},
        "dead": sorted(({"reason": r, "topic": t, "count": c} for (r, t), c in dead.items()),
                       key=lambda r: (r["reason"], r["topic"])),
        "top": top,
        "sessions": peaks("login", "logout", sessions_at_start),
        "subscribers": peaks("subscribe", "unsubscribe", subscribers_at_start),
    }


def usage_key(row: dict[str, Any]) -> tuple:
    return (row["dim"], row["key"], -1 if row["hour"] is None else row["hour"])


# --- for test servers: ``manage.py shell -c`` runs these against the server's database ------


def seed_database(day: date, publishes: int = 300, seed: int = 25) -> None:
    """The accounts and the generated events of ``day``."""
    from accounts.models import Account

    ids = {n: Account.objects.get_or_create(username=n)[0].pk for n in ACCOUNTS}
    insert(generate(day, publishes, seed, ids))


def check_report(day: date, publishes: int = 300, seed: int = 25) -> list[str]:
    """What differs between the stored report of ``day`` and the Python computation of the
    events :func:`seed_database` wrote (empty: the same)."""
    from accounts.models import Account
    from spark_jobs.models import UsageReport

    ids = {n: Account.objects.get(username=n).pk for n in ACCOUNTS}
    want = expected(generate(day, publishes, seed, ids), day, {v: k for k, v in ids.items()})
    report = UsageReport.objects.filter(day=day).first()
    if report is None or report.state != "done":
        return [f"no done report for {day}: {report and report.state}"]
    problems = []
    got = sorted(({"dim": r.dim, "key": r.key, "hour": r.hour,
                   **{m: getattr(r, m) for m in METRICS}} for r in report.usage.all()),
                 key=usage_key)
    if got != want["usage"]:
        problems.append(f"usage rows differ ({len(got)} stored, {len(want['usage'])} wanted)")
    if not got:
        problems.append("no usage rows")
    if report.events != want["events"]:
        problems.append(f"events {report.events} != {want['events']}")
    if report.sessions_hourly != want["sessions"]["hours"]:
        problems.append("sessions peaks differ")
    counts = {r.topic: r.count for r in report.latency.all()}
    if counts != {t: len(v) for t, v in want["latency"].items()}:
        problems.append("latency counts differ")
    return problems
