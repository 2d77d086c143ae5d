"""The Django cache's connection pool when Redis is reached through Sentinel (its own module:
:mod:`broker.redisconf`, which settings import everywhere, does not import redis-py)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from redis.sentinel import Sentinel, SentinelConnectionPool


class CacheSentinelPool(SentinelConnectionPool):
    """Django's RedisCache builds its pool with ``pool_class.from_url(LOCATION, **OPTIONS)``:
    this one reads ``sentinel://<master name>/<db>`` and the Sentinels from the options."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> CacheSentinelPool:  # type: ignore[override]
        parsed = urllib.parse.urlparse(url)
        sentinels = options.pop("sentinels")
        sentinel_kwargs = options.pop("sentinel_kwargs", None)
        db = int(parsed.path.strip("/") or 0)
        manager = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
        return cls(parsed.hostname or "smqp", manager, db=db, **options)
