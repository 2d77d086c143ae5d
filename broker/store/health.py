"""What a load balancer asks a process before it sends it clients (``/readyz``, and the SMQP
listener's own health port): can it reach the database (and write to it: not a replica left
behind by a failover), and Redis. Each check answers ``None`` when fine, else why not."""

from __future__ import annotations

import redis
from django.db import connection

from . import opsmetrics


def database_problem() -> str | None:
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_is_in_recovery()")
                if cursor.fetchone()[0]:
                    return "read-only: connected to a replica"
            else:
                cursor.execute("SELECT 1")
                cursor.fetchone()
    except Exception as exc:  # any driver error: the reason is the answer
        # A broken connection is not reused by the next check.
        connection.close_if_unusable_or_obsolete()
        return f"{type(exc).__name__}: {exc}".strip()[:300]
    return None


def redis_problem() -> str | None:
    try:
        opsmetrics.client().ping()
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None
