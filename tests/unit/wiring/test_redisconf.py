"""REDIS_SENTINELS / REDIS_MASTER_NAME turned into each Redis client's configuration."""

import pytest

from broker.redisconf import from_environment, parse_sentinels


def test_plain_url_is_unchanged_for_every_client():
    conf = from_environment({"REDIS_URL": "redis://10.0.0.5:6380/4"})
    assert conf.channel_host() == "redis://10.0.0.5:6380/4"
    assert conf.cache_location_and_options() == ("redis://10.0.0.5:6380/4", {})
    assert conf.celery_broker() == ("redis://10.0.0.5:6380/4", {})


def test_sentinels_parsed_with_default_port_and_ipv6():
    assert parse_sentinels("a:1, b ,[::1]:3,[fe80::2]") == [
        ("a", 1), ("b", 26379), ("::1", 3), ("fe80::2", 26379)]
    with pytest.raises(ValueError):
        parse_sentinels("a:port")


def test_sentinel_configuration_of_each_client():
    conf = from_environment({"REDIS_URL": "redis://:p%40ss@ignored/3",
                             "REDIS_SENTINELS": "s1:26379,s2:26380",
                             "REDIS_MASTER_NAME": "main", "REDIS_SENTINEL_PASSWORD": "sp"})
    host = conf.channel_host()
    assert host["sentinels"] == [("s1", 26379), ("s2", 26380)]
    assert (host["master_name"], host["db"], host["password"]) == ("main", 3, "p@ss")
    assert host["sentinel_kwargs"]["password"] == "sp"
    location, options = conf.cache_location_and_options()
    assert location == "sentinel://main/3"
    assert options["pool_class"] == "broker.redis_sentinel_pool.CacheSentinelPool"
    assert options["password"] == "p@ss"
    url, transport = conf.celery_broker()
    assert url == "sentinel://:p%40ss@s1:26379;sentinel://:p%40ss@s2:26380/3"
    assert transport == {"master_name": "main", "sentinel_kwargs": {"password": "sp"}}


def test_cache_pool_class_named_in_the_options_builds_a_sentinel_pool():
    """What Django's RedisCache does with the options: import the class by its dotted path and
    call ``from_url(LOCATION, **OPTIONS)``. Building the pool connects to nothing yet."""
    from django.utils.module_loading import import_string
    from redis.sentinel import SentinelConnectionPool

    conf = from_environment({"REDIS_URL": "redis://:pw@ignored/5",
                             "REDIS_SENTINELS": "s1:26379", "REDIS_MASTER_NAME": "main"})
    location, options = conf.cache_location_and_options()
    pool_class = import_string(options.pop("pool_class"))
    pool = pool_class.from_url(location, **options)
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "main"
    assert pool.connection_kwargs["db"] == 5
    assert pool.connection_kwargs["password"] == "pw"
    assert pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs["host"] == "s1"
