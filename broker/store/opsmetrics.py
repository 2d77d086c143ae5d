"""Operational counters shared through Redis: message rates, group-commit sizes and
latencies, and each listener's storage-process health.

Why Redis and not prometheus-client's multiprocess mode: what is counted happens in the
SMQP listener (its dispatcher's group commits, its sessions' NOTIFYs), while ``/metrics``
and the overview are served by Daphne, another process and possibly another machine.
Redis is already the processes' meeting point (channel layer, generation counters), works
across hosts, and keeps the counters when a listener restarts; the multiprocess mode needs
one shared directory, a cleanup of dead processes' files and an environment variable set
before every import. Counting costs the event loop a dict update: a :class:`Recorder`
gathers in memory and the dispatcher writes it to Redis about once a second
(:func:`flush`, one pipeline, in a thread).

Keys (under the cache prefix, so that tests and servers sharing a Redis stay apart):
``ops:totals`` (hash: counters since the Redis was empty), ``ops:m:<minute>`` and
``ops:h:<hour>`` (hashes of counts per epoch minute / hour, expiring), and
``ops:listener:<origin>`` (JSON health of one live listener, expiring unless refreshed),
``ops:session:<guid>`` (hash: one session's messages ``in`` and ``out`` and its listener's
last word on ``unacked``) and ``ops:sm:<minute>`` (hash: ``<guid>:in`` / ``<guid>:out`` counts
per epoch minute, for the sessions' rates).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import redis
from django.conf import settings

logger = logging.getLogger("broker.opsmetrics")

#: What the rates count: messages committed by a publish batch, NOTIFY MESSAGEs sent, ACKs
#: committed.
RATE_KINDS = ("publish", "deliver", "ack")
#: Group commits by lane kind.
COMMIT_KINDS = ("publish", "ack")
_TOTAL_NAMES = {kind: f"{kind}_messages" for kind in RATE_KINDS}
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, math.inf)
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, math.inf)
MINUTE_KEEP_SECONDS = 2 * 3600
HOUR_KEEP_SECONDS = 26 * 3600
#: A listener's health record lives this long unless written again (it is every flush).
HEALTH_TTL_SECONDS = 15
#: A session's counters outlive it by this much (a session is ended by its listener; a
#: listener killed outright leaves them to expire).
SESSION_KEEP_SECONDS = 7 * 24 * 3600
SESSION_MINUTE_KEEP_SECONDS = 3 * 60

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = settings.REDIS.client(socket_timeout=5, socket_connect_timeout=5,
                                        decode_responses=True)
    return _client


def key(*parts: str | int) -> str:
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "smqp")
    return ":".join((prefix, "ops", *(str(p) for p in parts)))


def bucket_label(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


@dataclass
class Deltas:
    """What was counted since the last flush."""

    totals: Counter[str] = field(default_factory=Counter)
    floats: Counter[str] = field(default_factory=Counter)
    minutes: dict[int, Counter[str]] = field(default_factory=dict)
    #: Per session and minute: (guid, "in" | "out", epoch minute) → messages.
    sessions: Counter[tuple[str, str, int]] = field(default_factory=Counter)

    def __bool__(self) -> bool:
        return bool(self.totals or self.floats or self.sessions)

    def merge(self, other: Deltas) -> None:
        self.totals.update(other.totals)
        self.floats.update(other.floats)
        self.sessions.update(other.sessions)
        for minute, counts in other.minutes.items():
            self.minutes.setdefault(minute, Counter()).update(counts)


class Recorder:
    """In-memory counts of one process, taken by :func:`flush`. Not thread-safe: the
    listener's event loop is its only writer."""

    def __init__(self) -> None:
        self._deltas = Deltas()

    def count(self, kind: str, n: int = 1, now: float | None = None) -> None:
        """``n`` more of a rate kind (:data:`RATE_KINDS`), in this minute's bucket."""
        if n <= 0:
            return
        # Once per NOTIFY on the listener's event loop: kept to a few dict operations.
        minute = int((now if now is not None else time.time()) // 60)
        deltas = self._deltas
        deltas.totals[_TOTAL_NAMES.get(kind) or f"{kind}_messages"] += n
        bucket = deltas.minutes.get(minute)
        if bucket is None:
            bucket = deltas.minutes[minute] = Counter()
        bucket[kind] += n

    def session(self, guid: str | None, direction: str, n: int = 1,
                now: float | None = None) -> None:
        """``n`` messages into (published by) or out of (sent to) the session ``guid``."""
        if n <= 0 or not guid:
            return
        minute = int((now if now is not None else time.time()) // 60)
        self._deltas.sessions[(guid, direction, minute)] += n

    def commit(self, kind: str, size: int, seconds: float) -> None:
        """One group commit of ``kind`` (:data:`COMMIT_KINDS`): ``size`` requests in it,
        ``seconds`` from sending it to the storage process to its answer."""
        d = self._deltas
        d.totals[f"{kind}_commits"] += 1
        d.totals[f"{kind}_commit_size_sum"] += size
        d.floats[f"{kind}_commit_seconds_sum"] += seconds
        d.totals[f"{kind}_commit_size_le_{bucket_label(_bucket(size, SIZE_BUCKETS))}"] += 1
        d.totals[f"{kind}_commit_seconds_le_"
                 f"{bucket_label(_bucket(seconds, LATENCY_BUCKETS))}"] += 1

    def failed(self, kind: str) -> None:
        self._deltas.totals[f"{kind}_commit_failures"] += 1

    def take(self) -> Deltas:
        taken, self._deltas = self._deltas, Deltas()
        return taken

    def give_back(self, deltas: Deltas) -> None:
        """A flush failed (Redis away): keep its counts for the next one."""
        deltas.merge(self._deltas)
        self._deltas = deltas


def _bucket(value: float, bounds: tuple[float, ...]) -> float:
    for bound in bounds:
        if value <= bound:
            return bound
    return math.inf


def flush(deltas: Deltas, health: dict | None = None, origin: str = "",
          unacked: dict[str, int] | None = None) -> None:
    """Add ``deltas`` to the shared counters, and (re)write this listener's health and its
    sessions' ``unacked`` gauges (guid → messages sent and not yet ACKed); one pipeline.
    Raises ``redis.RedisError`` when Redis is unreachable."""
    pipe = client().pipeline(transaction=False)
    for (guid, direction, minute), n in deltas.sessions.items():
        skey, mkey = key("session", guid), key("sm", minute)
        pipe.hincrby(skey, direction, n)
        pipe.expire(skey, SESSION_KEEP_SECONDS)
        pipe.hincrby(mkey, f"{guid}:{direction}", n)
        pipe.expire(mkey, SESSION_MINUTE_KEEP_SECONDS)
    for guid, n in (unacked or {}).items():
        skey = key("session", guid)
        pipe.hset(skey, "unacked", n)
        pipe.expire(skey, SESSION_KEEP_SECONDS)
    totals = key("totals")
    for name, n in deltas.totals.items():
        pipe.hincrby(totals, name, n)
    for name, x in deltas.floats.items():
        pipe.hincrbyfloat(totals, name, x)
    for minute, counts in deltas.minutes.items():
        mkey, hkey = key("m", minute), key("h", minute // 60)
        for kind, n in counts.items():
            pipe.hincrby(mkey, kind, n)
            pipe.hincrby(hkey, kind, n)
        pipe.expire(mkey, MINUTE_KEEP_SECONDS)
        pipe.expire(hkey, HOUR_KEEP_SECONDS)
    if health is not None:
        pipe.set(key("listener", origin), json.dumps(health), ex=HEALTH_TTL_SECONDS)
    pipe.execute()


def count_now(kind: str, n: int = 1) -> None:
    """Count ``n`` messages of a rate kind at once, from a process with no dispatcher (a
    REST view's single publish, say). Best-effort: a Redis error is logged, not raised."""
    recorder = Recorder()
    recorder.count(kind, n)
    try:
        flush(recorder.take())
    except redis.RedisError:
        logger.warning("could not count %s", kind, exc_info=True)


# ------------------------------------------------------------------------------ readers


def totals() -> dict[str, float]:
    return {name: float(v) for name, v in client().hgetall(key("totals")).items()}


def series(unit: str, first: int, count: int) -> dict[str, list[int]]:
    """Counts per rate kind for ``count`` consecutive buckets from ``first`` (epoch minutes
    for ``unit`` "m", epoch hours for "h")."""
    pipe = client().pipeline(transaction=False)
    for n in range(first, first + count):
        pipe.hgetall(key(unit, n))
    rows = pipe.execute()
    return {kind: [int(row.get(kind, 0)) for row in rows] for kind in RATE_KINDS}


def sessions(guids: list[str], now: float | None = None) -> dict[str, dict]:
    """guid → {"in", "out", "unacked", "rate_in", "rate_out"} of these sessions: totals
    since login, and messages per second over the last minute (the finished minute,
    weighted by how much of it is still within 60 s, plus the current one)."""
    if not guids:
        return {}
    now = time.time() if now is None else now
    minute = int(now // 60)
    into = (now % 60) / 60  # of the current minute
    pipe = client().pipeline(transaction=False)
    for guid in guids:
        pipe.hgetall(key("session", guid))
    pipe.hgetall(key("sm", minute - 1))
    pipe.hgetall(key("sm", minute))
    *rows, before, current = pipe.execute()
    out = {}
    for guid, row in zip(guids, rows, strict=True):
        rates = {}
        for direction in ("in", "out"):
            field_ = f"{guid}:{direction}"
            recent = int(current.get(field_, 0)) + int(before.get(field_, 0)) * (1 - into)
            rates[f"rate_{direction}"] = round(recent / 60, 3)
        out[guid] = {"in": int(row.get("in", 0)), "out": int(row.get("out", 0)),
                     "unacked": int(row.get("unacked", 0)), **rates}
    return out


def listeners() -> list[dict]:
    """The health records of the listeners that flushed within :data:`HEALTH_TTL_SECONDS`."""
    r = client()
    keys = sorted(r.scan_iter(match=key("listener", "*"), count=100))
    if not keys:
        return []
    return [json.loads(v) for v in r.mget(keys) if v]
