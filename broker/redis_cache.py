"""The Django cache backend: Django's RedisCache, with one redis-py client per connection pool
instead of a new one for every cache call.

Django's ``RedisCacheClient.get_client`` builds a ``redis.Redis`` on each ``get``/``set``,
and each build fills that client's table of several hundred reply callbacks: about a tenth
of the listener's CPU per SMQP login went there (its throttle, session and snapshot-cache
calls). A redis-py client is safe to share between threads (each command takes a
connection from the pool); the pools are Django's own, kept as before (per backend
instance, which Django's cache handler makes per thread).
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _SharedClient(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            # Two threads racing here build one client each; either serves.
            client = self._clients[index] = self._client(
                connection_pool=self._get_connection_pool(write))
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _SharedClient
