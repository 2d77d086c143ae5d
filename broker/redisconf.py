"""How every process reaches Redis: one URL (``REDIS_URL``, the default) or the master that
Redis Sentinel names (``REDIS_SENTINELS`` + ``REDIS_MASTER_NAME``), for all four users of
Redis: the channel layer (wake-ups, notifications), the Django cache (generation counters,
login throttles), Celery's broker, and the operational counters (:mod:`broker.store.opsmetrics`).

With Sentinel, ``REDIS_URL`` still says which database number and which password the master
is reached with (``redis://:secret@ignored/3``); its host is not used. Each client asks the
Sentinels for the master at every new connection and checks the server it reached is still a
master (redis-py's ``SentinelManagedConnection``), so after a failover the next connection goes
to the new master with no restart.

Wiring, not a layer (like settings): it imports only redis-py and the standard library, and
redis-py only when a client is built: settings import this module in every process, and most
``manage.py`` commands never reach Redis (redis-py's import costs ~70 ms of each start).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis


@dataclass(frozen=True)
class RedisConfig:
    url: str
    sentinels: list[tuple[str, int]] = field(default_factory=list)
    master_name: str = "smqp"
    sentinel_password: str = ""

    @property
    def db(self) -> int:
        path = urllib.parse.urlparse(self.url).path.strip("/")
        if path.isdigit():
            return int(path)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.url).query)
        return int(query.get("db", ["0"])[0])

    @property
    def password(self) -> str | None:
        parsed = urllib.parse.urlparse(self.url)
        return urllib.parse.unquote(parsed.password) if parsed.password else None

    def sentinel_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"socket_timeout": 2, "socket_connect_timeout": 2}
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs

    def master_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"db": self.db}
        if self.password:
            kwargs["password"] = self.password
        return kwargs

    # --- what settings.py hands to each client -------------------------------------------
    def channel_host(self) -> str | dict[str, Any]:
        """One ``hosts`` entry of channels_redis (it builds a Sentinel pool from a dict)."""
        if not self.sentinels:
            return self.url
        return {"sentinels": self.sentinels, "master_name": self.master_name,
                "sentinel_kwargs": self.sentinel_kwargs(), **self.master_kwargs()}

    def cache_location_and_options(self) -> tuple[str, dict[str, Any]]:
        if not self.sentinels:
            return self.url, {}
        return (f"sentinel://{self.master_name}/{self.db}",
                {"pool_class": "broker.redis_sentinel_pool.CacheSentinelPool",
                 "sentinels": self.sentinels, "sentinel_kwargs": self.sentinel_kwargs(),
                 **({"password": self.password} if self.password else {})})

    def celery_broker(self) -> tuple[str, dict[str, Any]]:
        """Kombu's URL and transport options: ``sentinel://h1:p1;sentinel://h2:p2/db``."""
        if not self.sentinels:
            return self.url, {}
        auth = f":{urllib.parse.quote(self.password)}@" if self.password else ""
        url = ";".join(f"sentinel://{auth}{h}:{p}" for h, p in self.sentinels) + f"/{self.db}"
        options: dict[str, Any] = {"master_name": self.master_name}
        if self.sentinel_password:
            options["sentinel_kwargs"] = {"password": self.sentinel_password}
        return url, options

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous client of the master (what :mod:`broker.store.opsmetrics` and the
        health checks use)."""
        import redis
        from redis.sentinel import Sentinel

        if not self.sentinels:
            return redis.Redis.from_url(self.url, **kwargs)
        sentinel = Sentinel(self.sentinels, sentinel_kwargs=self.sentinel_kwargs())
        return sentinel.master_for(self.master_name, **self.master_kwargs(), **kwargs)


def parse_sentinels(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (IPv6 in brackets; port 26379 when left out)."""
    sentinels = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.lstrip(":") or "26379"
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, "26379"
        if not host or not port.isdigit():
            raise ValueError(f"REDIS_SENTINELS: {item!r} is not host:port")
        sentinels.append((host, int(port)))
    return sentinels


def from_environment(environ: Any) -> RedisConfig:
    sentinels = parse_sentinels(environ.get("REDIS_SENTINELS", ""))
    return RedisConfig(
        url=environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        sentinels=sentinels,
        master_name=environ.get("REDIS_MASTER_NAME", "smqp") or "smqp",
        sentinel_password=environ.get("REDIS_SENTINEL_PASSWORD", ""),
    )
