"""The cache backend (broker/redis_cache.py) keeps one redis-py client per connection pool,
where Django's builds one per cache call. Nothing here connects: redis-py connects on the
first command."""

from __future__ import annotations

from django.conf import settings
from django.core.cache.backends.redis import RedisCacheClient

from broker.redis_cache import RedisCache


def test_the_configured_backend_is_this_one():
    assert settings.CACHES["default"]["BACKEND"] == "broker.redis_cache.RedisCache"


def test_one_client_per_pool_reused_by_every_call():
    cache = RedisCache("redis://127.0.0.1:6379/15", {})
    client = cache._cache.get_client()
    assert client is cache._cache.get_client("some key")
    assert client is cache._cache.get_client(write=True)  # one server: one pool for both
    assert client.connection_pool is cache._cache._get_connection_pool(write=True)
    # Django's own client builds a new one each time (what this avoids).
    django_client = RedisCacheClient(["redis://127.0.0.1:6379/15"])
    assert django_client.get_client() is not django_client.get_client()


def test_replicas_each_get_their_own_client():
    cache = RedisCache("redis://127.0.0.1:6379/15,redis://127.0.0.1:6380/15", {})
    writer = cache._cache.get_client(write=True)
    reader = cache._cache.get_client()
    assert writer.connection_pool.connection_kwargs["port"] == 6379
    assert reader.connection_pool.connection_kwargs["port"] == 6380
    assert writer is cache._cache.get_client(write=True) and reader is cache._cache.get_client()
