"""Every user of Redis (cache, channel layer, Celery's broker, the ops counters) finds the
master through real Sentinels when ``REDIS_SENTINELS`` is set, and follows a failover
without a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.support.sentinel import sentinel_set
from tests.support.timing import scaled

pytestmark = [pytest.mark.timeout(180)]

PROBE = """
import asyncio, json, sys, uuid
import django
django.setup()
from django.conf import settings
from django.core.cache import cache
from channels.layers import get_channel_layer
from broker.celery import app
from broker.store import opsmetrics

tag = sys.argv[1]
cache.set("probe", tag, 60)
got_cache = cache.get("probe")

async def layer_round_trip():
    layer = get_channel_layer()
    name = await layer.new_channel()
    await layer.group_add("probe", name)
    await layer.group_send("probe", {"type": "probe", "tag": tag})
    msg = await asyncio.wait_for(layer.receive(name), 10)
    await layer.flush()
    return msg["tag"]

got_layer = asyncio.run(layer_round_trip())
with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
    with conn.SimpleQueue("probe-" + tag) as q:
        q.put({"tag": tag})
        got_celery = q.get(timeout=10).payload["tag"]
opsmetrics.client().set("probe-ops", tag)
print(json.dumps({"cache": got_cache, "layer": got_layer, "celery": got_celery,
                  "ops": opsmetrics.client().get("probe-ops"),
                  "location": settings.CACHES["default"]["LOCATION"]}))
"""


def probe(env: dict[str, str], tag: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, tag], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_redis_user_goes_through_sentinel_and_follows_a_failover(tmp_path):
    with sentinel_set(tmp_path) as ss:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SMQP_", "REDIS_"))}
        env.update(ss.env, DJANGO_SETTINGS_MODULE="broker.settings",
                   SMQP_VAR_DIR=str(tmp_path), SMQP_CACHE_PREFIX="sentinel-test")
        env.pop("CELERY_BROKER_URL", None)
        first = ss.master_port()
        assert probe(env, "one") == {"cache": "one", "layer": "one", "celery": "one",
                                     "ops": "one", "location": "sentinel://smqp/0"}
        # It was the master Sentinel names that the keys reached.
        assert ss.redis(first).get("probe-ops") == "one"

        ss.sentinel().execute_command("SENTINEL", "FAILOVER", "smqp")
        deadline = time.monotonic() + scaled(60)
        while ss.master_port() == first:
            assert time.monotonic() < deadline, "Sentinel did not fail over"
            time.sleep(0.2)
        second = ss.master_port()
        # The new master accepts writes once it has left its replica role.
        while ss.redis(second).info("replication")["role"] != "master":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert probe(env, "two") == {"cache": "two", "layer": "two", "celery": "two",
                                     "ops": "two", "location": "sentinel://smqp/0"}
        assert ss.redis(second).get("probe-ops") == "two"
