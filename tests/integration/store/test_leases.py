"""Cluster leases (broker/store/leases.py) on a real database of each backend: one holder at
a time, renewal by the holder, takeover once it lapses, release, many takers racing, and a
renewal that comes back too late to count."""

from __future__ import annotations

import json

import pytest

from tests.conftest import fresh_database, run_manage

SCRIPT = r"""
import json, threading, time
from django.db import connection
from broker.store import leases

out = {}
out["a_takes"] = sorted(leases.acquire(["beat", "link:1"], "a", 1.5))
out["b_refused"] = sorted(leases.acquire(["beat", "link:1"], "b", 1.5))
out["a_renews"] = sorted(leases.acquire(["beat"], "a", 1.5))
out["holders"] = leases.holders()
time.sleep(2.0)
out["b_after_lapse"] = sorted(leases.acquire(["beat", "link:1"], "b", 30))
out["a_refused_now"] = sorted(leases.acquire(["beat"], "a", 30))
leases.release(["beat"], "b")
out["c_after_release"] = sorted(leases.acquire(["beat"], "c", 30))

# Many takers at once, each on its own connection: exactly one wins.
wins = []
def take(i):
    try:
        wins.extend(leases.acquire(["race"], f"t{i}", 30))
    finally:
        connection.close()
threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
out["race_wins"] = len(wins)

lease = leases.Lease(ttl=30, holder="d")
out["lease_gets_free"] = sorted(lease.renew(["x", "race"]))
out["held_x"] = lease.held("x")
lease.release()
out["released"] = "x" not in leases.holders()

# A renewal that comes back after its own fence (it waited on a row lock) holds nothing:
# the next one decides.
slow = leases.Lease(ttl=2.0, holder="e")
real_acquire = leases.acquire
def waited(*args):
    time.sleep(slow.ttl)
    return real_acquire(*args)
leases.acquire = waited
out["late_renewal"] = sorted(slow.renew(["y"]))
out["late_held"] = slow.held("y")
leases.acquire = real_acquire
out["next_renewal"] = sorted(slow.renew(["y"]))
out["next_held"] = slow.held("y")
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_one_holder_renewal_takeover_release_and_race(backend, tmp_path):
    with fresh_database(backend, tmp_path) as env:
        out = json.loads(run_manage(env, "shell", "--no-imports", "-c", SCRIPT)
                         .stdout.strip().splitlines()[-1])
    assert out["a_takes"] == ["beat", "link:1"]
    assert out["b_refused"] == []
    assert out["a_renews"] == ["beat"]
    assert out["holders"] == {"beat": "a", "link:1": "a"}
    assert out["b_after_lapse"] == ["beat", "link:1"]
    assert out["a_refused_now"] == []
    assert out["c_after_release"] == ["beat"]
    assert out["race_wins"] == 1
    assert out["lease_gets_free"] == ["x"] and out["held_x"] is True
    assert out["released"] is True
    assert out["late_renewal"] == [] and out["late_held"] is False
    assert out["next_renewal"] == ["y"] and out["next_held"] is True
