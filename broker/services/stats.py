"""What the operators see: message rates, queue depths, sessions per door, dead letters,
group commits and storage-process health, for the admin overview, ``/metrics`` and the REST
``/api/v1/stats/``. One place computes them; every view formats this.

Where each figure comes from:
- rates and group commits: the listeners' counters in Redis (:mod:`broker.store.opsmetrics`),
  written by each listener's dispatcher about once a second: publishes and ACKs as their
  group commits succeed, deliveries as a session writes ``NOTIFY MESSAGE``. A door that
  publishes without a dispatcher counts with :func:`broker.store.opsmetrics.count_now`.
- depths, sessions, dead letters, per-topic detail: the database, at the time of the call.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import redis
from django.db.models import Count, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from accounts.models import Account, LoginSession
from broker.models import Delivery, Message, Subscription
from broker.store import opsmetrics
from topics.models import Topic

from . import federation, notify
from . import topics as topic_service

#: How many topics, dead letters and sessions a snapshot lists at most.
TOP_TOPICS = 50
RECENT_DEAD = 20
MINUTES = 60
HOURS = 24


def door_of(session: LoginSession) -> str:
    """Which door a session came through, as a lower-case name: a ``door`` field if the
    model has one, else a ``door:`` prefix of its auth method (``xmpp:PLAIN``), else
    ``smqp`` (SMQP's CLEAR/1.0 and SCRAM-SHA-256/1.0 carry none)."""
    door = getattr(session, "door", "")
    if door:
        return str(door).lower()
    return _door_of_method(session.auth_method)


def _door_of_method(method: str) -> str:
    head, sep, _ = (method or "").partition(":")
    return head.lower() if sep and head else "smqp"


def rates(now: float | None = None) -> dict:
    """Messages per minute over the last :data:`MINUTES` minutes and per hour over the last
    :data:`HOURS` hours (the current, partial one last): see :func:`snapshot`."""
    now = time.time() if now is None else now
    minute, hour = int(now // 60), int(now // 3600)
    first_m, first_h = minute - MINUTES + 1, hour - HOURS + 1
    return {
        "minutes": {"start": _iso(first_m * 60), "step_seconds": 60,
                    **opsmetrics.series("m", first_m, MINUTES)},
        "hours": {"start": _iso(first_h * 3600), "step_seconds": 3600,
                  **opsmetrics.series("h", first_h, HOURS)},
    }


def group_commits(totals: dict[str, float] | None = None) -> dict:
    """Per lane kind (publish, ack): how many group commits, their sizes and latencies."""
    totals = opsmetrics.totals() if totals is None else totals
    result = {}
    for kind in opsmetrics.COMMIT_KINDS:
        count = int(totals.get(f"{kind}_commits", 0))
        size_sum = int(totals.get(f"{kind}_commit_size_sum", 0))
        seconds_sum = totals.get(f"{kind}_commit_seconds_sum", 0.0)
        result[kind] = {
            "count": count,
            "failures": int(totals.get(f"{kind}_commit_failures", 0)),
            "size_sum": size_sum,
            "seconds_sum": seconds_sum,
            "mean_size": size_sum / count if count else None,
            "mean_seconds": seconds_sum / count if count else None,
            "size_buckets": _buckets(totals, f"{kind}_commit_size_le_", opsmetrics.SIZE_BUCKETS),
            "seconds_buckets": _buckets(totals, f"{kind}_commit_seconds_le_",
                                        opsmetrics.LATENCY_BUCKETS),
        }
    return result


def _buckets(totals: dict[str, float], prefix: str, bounds: tuple[float, ...]) -> dict:
    """Cumulative counts per upper bound (Prometheus' ``le``), as labels."""
    running = 0
    out = {}
    for bound in bounds:
        label = opsmetrics.bucket_label(bound)
        running += int(totals.get(prefix + label, 0))
        out[label] = running
    return out


def message_totals(totals: dict[str, float] | None = None) -> dict[str, int]:
    totals = opsmetrics.totals() if totals is None else totals
    return {kind: int(totals.get(f"{kind}_messages", 0)) for kind in opsmetrics.RATE_KINDS}


def depths(limit: int | None = TOP_TOPICS) -> list[dict]:
    """Per real topic with anything in it: messages stored (pending state), deliveries
    waiting (pending), locked to a session (queue mode) and dead; the deepest first."""
    per: dict[int, dict] = {}

    def row(topic_id: int) -> dict:
        return per.setdefault(topic_id, {"messages": 0, "pending": 0, "locked": 0, "dead": 0})

    for r in (Message.objects.filter(state=Message.State.PENDING).values("topic_id")
              .annotate(n=Count("id"))):
        row(r["topic_id"])["messages"] = r["n"]
    names = {Delivery.State.PENDING: "pending", Delivery.State.NOTIFIED: "locked",
             Delivery.State.DEAD: "dead"}
    for r in (Delivery.objects.filter(state__in=list(names)).values("message__topic_id", "state")
              .annotate(n=Count("id"))):
        row(r["message__topic_id"])[names[r["state"]]] = r["n"]
    paths = dict(Topic.objects.filter(pk__in=list(per)).values_list("pk", "path"))
    rows = [{"path": paths[tid], **counts} for tid, counts in per.items() if tid in paths]
    rows.sort(key=lambda r: (-(r["pending"] + r["locked"] + r["messages"]), r["path"]))
    return rows[:limit] if limit is not None else rows


def sessions_by_door() -> dict[str, int]:
    counts: dict[str, int] = {}
    if _has_door_field():
        for r in (LoginSession.objects.filter(ended__isnull=True).values("door")
                  .annotate(n=Count("id"))):
            door = (r["door"] or "smqp").lower()
            counts[door] = counts.get(door, 0) + r["n"]
        return counts
    for r in (LoginSession.objects.filter(ended__isnull=True).values("auth_method")
              .annotate(n=Count("id"))):
        door = _door_of_method(r["auth_method"])
        counts[door] = counts.get(door, 0) + r["n"]
    return counts


def _has_door_field() -> bool:
    return any(f.name == "door" for f in LoginSession._meta.get_fields())


def live_sessions(account_ids: list[int] | None = None, limit: int = 500) -> list[dict]:
    """Sessions not ended, newest first (of these accounts only, if given)."""
    qs = LoginSession.objects.filter(ended__isnull=True).select_related("account")
    if account_ids is not None:
        qs = qs.filter(account_id__in=account_ids)
    return [session_data(s) for s in qs.order_by("-started")[:limit]]


def session_data(s: LoginSession) -> dict:
    return {"guid": s.guid, "account": s.account.username, "door": door_of(s),
            "auth_method": s.auth_method, "peer": s.peer_address,
            "server_context": s.server_context, "started": s.started.isoformat()}


def dead_letters(limit: int = RECENT_DEAD) -> list[dict]:
    """The latest dead deliveries (retries spent): whose, which message, and whether the
    message can be republished (it is in Trash)."""
    rows = (Delivery.objects.filter(state=Delivery.State.DEAD)
            .select_related("account", "message__topic")
            .order_by("-last_attempt", "-id")[:limit])
    return [{"smuid": d.message_id, "topic": d.message.topic.path,
             "account": d.account.username, "attempts": d.attempts,
             "at": d.last_attempt.isoformat() if d.last_attempt else None,
             "message_state": d.message.state,
             "republishable": d.message.state == Message.State.TRASH}
            for d in rows]


def links() -> list[dict]:
    """Federation links with their state, counters, last error and backlog (as the REST
    API shows them: :func:`.federation.link_data`), from the ``Link`` rows the supervisor
    writes."""
    return [federation.link_data(link) for link in federation.links()]


def snapshot() -> dict:
    """Everything the overview shows, as plain JSON-able values::

        {
          "generated": "2026-11-24T23:10:00+00:00",
          "rates": {                         # messages counted by the listeners
            "minutes": {"start": ISO, "step_seconds": 60,
                        "publish": [60 ints], "deliver": [...], "ack": [...]},
            "hours":   {"start": ISO, "step_seconds": 3600,
                        "publish": [24 ints], "deliver": [...], "ack": [...]},
          },                                 # oldest first; the last bucket is the current one
          "totals": {"publish": n, "deliver": n, "ack": n},   # since Redis was empty
          "topics": [{"path": "/news", "messages": n,         # stored, not yet expired
                      "pending": n, "locked": n, "dead": n}], # deliveries by state
          "sessions": {"total": n, "by_door": {"smqp": n, "qqp": n, ...}},
          "dead_letters": [{"smuid", "topic", "account", "attempts", "at",
                            "message_state", "republishable"}],
          "group_commits": {"publish": {...}, "ack": {...}},  # see group_commits()
          "listeners": [{"origin", "host", "pid", "command", "role", "started", "at", "sessions",
                         "journal_backlog", "publish_queue",
                         "storage_processes": [{"name", "pid", "alive", "waiting",
                                                "starts"}]}],
          "links": [{"name", "host", "port", "state", "up", "enabled", "backlog",
                     "stored", "dropped", "last_error", "last_change", ...}],
          "counters_unavailable": None | "Redis: ...",  # then rates, totals, group
        }                                    # commits are 0 and listeners empty
    """
    by_door = sessions_by_door()
    try:
        totals = opsmetrics.totals()
        counted = {"rates": rates(), "listeners": opsmetrics.listeners(),
                   "counters_unavailable": None}
    except redis.RedisError as exc:  # the store's figures still stand; the counters wait
        totals = {}
        counted = {"rates": empty_rates(), "listeners": [],
                   "counters_unavailable": f"Redis: {exc}"}
    return {
        "generated": timezone.now().isoformat(),
        **counted,
        "totals": message_totals(totals),
        "topics": depths(),
        "sessions": {"total": sum(by_door.values()), "by_door": by_door},
        "dead_letters": dead_letters(),
        "group_commits": group_commits(totals),
        "links": links(),
    }


def empty_rates(now: float | None = None) -> dict:
    """:func:`rates` with every count 0 (the counters cannot be read)."""
    now = time.time() if now is None else now
    zero = {kind: [0] * MINUTES for kind in opsmetrics.RATE_KINDS}
    return {
        "minutes": {"start": _iso((int(now // 60) - MINUTES + 1) * 60), "step_seconds": 60,
                    **zero},
        "hours": {"start": _iso((int(now // 3600) - HOURS + 1) * 3600), "step_seconds": 3600,
                  **{kind: [0] * HOURS for kind in opsmetrics.RATE_KINDS}},
    }


#: Per message: its deliveries, how many are ACKed, how many dead (for :func:`message_status`).
DELIVERY_COUNTS = {
    "n_deliveries": Count("deliveries"),
    "n_acked": Count("deliveries", filter=Q(deliveries__state=Delivery.State.ACKED)),
    "n_dead": Count("deliveries", filter=Q(deliveries__state=Delivery.State.DEAD)),
}


def message_status(state: str, deliveries: int, acked: int, dead: int) -> str:
    """What a stored message's state means for its subscribers. "pending" is the message's
    place (in its topic, not in Trash), not its deliveries': a fan-out message every
    subscriber ACKed stays there until its timeout, and must not read as undelivered."""
    if state != Message.State.PENDING:
        return state
    if deliveries == 0:
        return "stored, no delivery (no subscriber)"
    if acked + dead == deliveries:
        return (f"ACKed by all {acked}" if not dead else
                f"ACKed by {acked}, dead for {dead}") + "; kept until its timeout"
    return f"ACKed by {acked} of {deliveries}" + (f", dead for {dead}" if dead else "")



def topic_detail(path: str) -> dict | None:
    """One topic for its console page: depth, per-minute publishes and ACKs over the last
    hour (from the store: messages received, deliveries ACKed), its subscribing accounts
    and their live sessions, and its latest messages. None when there is no such topic."""
    found = topic_service.find(path)
    if found is None:
        return None
    topic = found.resolved()
    depth = next((r for r in depths(None) if r["path"] == topic.path),
                 {"path": topic.path, "messages": 0, "pending": 0, "locked": 0, "dead": 0})
    now = timezone.now()
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=MINUTES - 1)
    published = _per_minute(Message.objects.filter(topic=topic, received__gte=first),
                            "received", first)
    acked = _per_minute(Delivery.objects.filter(message__topic=topic, acked__gte=first),
                        "acked", first)
    # Of the topic as asked: a virtual topic's subscribers by its own name count too.
    subscriber_ids = sorted(topic_service.subscriber_accounts(found))
    names = dict(Account.objects.filter(pk__in=subscriber_ids).values_list("pk", "username"))
    sessions = live_sessions(subscriber_ids)
    subscribers = [{"account": names[a], "sessions": [s for s in sessions
                                                      if s["account"] == names[a]]}
                   for a in subscriber_ids if a in names]
    recent = [{"smuid": m.pk, "received": m.received.isoformat(), "size": m.size,
               "state": m.state, "cmuid": m.cmuid, "deliveries": m.n_deliveries,
               "acked": m.n_acked, "dead": m.n_dead}
              for m in Message.objects.filter(topic=topic).annotate(**DELIVERY_COUNTS)
              .order_by("-id")[:10]]
    for m in recent:
        m["status"] = message_status(m["state"], m["deliveries"], m["acked"], m["dead"])
    return {
        "path": topic.path,
        "asked": path,
        "delivery_mode": topic.delivery_mode,
        "state": topic.state,
        "depth": depth,
        "trash": Message.objects.filter(topic=topic, state=Message.State.TRASH).count(),
        "rates": {"start": first.isoformat(), "step_seconds": 60,
                  "publish": published, "ack": acked},
        "subscriptions": Subscription.objects.filter(
            resource=Subscription.Resource.MESSAGE,
            pattern_key__in=topic_service.covering_patterns(topic.key)).count(),
        "subscribers": subscribers,
        # Queue mode: which sessions hold locks on its messages now, and how many.
        "locks": [{"holder": r["holder"], "count": r["n"]} for r in (
            Delivery.objects.filter(message__topic=topic, state=Delivery.State.NOTIFIED)
            .values("holder").annotate(n=Count("id")).order_by("-n", "holder"))],
        "recent": recent,
    }


def _per_minute(qs, field: str, first: datetime) -> list[int]:
    counts = [0] * MINUTES
    for r in qs.annotate(minute=TruncMinute(field)).values("minute").annotate(n=Count("id")):
        index = int((r["minute"] - first).total_seconds() // 60)
        if 0 <= index < MINUTES:
            counts[index] += r["n"]
    return counts


def close_session(guid: str) -> bool:
    """Ask the listener holding this session to close it (``NOTIFY SERVER BYE``, then the
    connection ends, and with it the session and its queue-mode locks). False when no live
    session has this guid. The listener ends the session row itself as it closes."""
    session = LoginSession.objects.filter(guid=guid, ended__isnull=True).first()
    if session is None:
        return False
    notify.send_after_commit([session.account_id], notify.close_session_event(guid))
    return True


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()
