"""Federation (profile §9.5) across a real network interface: broker A runs in a network
namespace of its own, joined to the test's namespace (where broker B runs) by a veth pair, so
both links (B's to A, A's to B) cross a real interface (``ip netns``, ``ip link add ... type
veth``). Both brokers use a Redis of their own on a Unix socket (reachable from either
namespace: a filesystem path) and SQLite.

The link is then cut (the veth taken down) while A publishes, and brought back: nothing is
lost and nothing stored twice. Skipped only where network namespaces cannot be made (not
root, or no ``ip netns``): the reason is given.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.federation.test_triangle import (
    publish,
    state,
    stored_origins,
    subscribe,
    wait_subscribed,
)
from tests.support.federation_net import link_all, prepared, wait_for
from tests.support.smqp_session import header
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=scaled(30))


@pytest.fixture
def netns():
    """A namespace ``ns`` with ``veth`` inside (10.201.N.1/24), its peer in this namespace
    (10.201.N.2/24); removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2)")
    name = f"fed{uuid.uuid4().hex[:6]}"
    n = random.randint(1, 250)
    inner, outer = f"{name}i", f"{name}o"
    try:
        ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces not permitted here: {exc.stderr.strip()}")
    try:
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", name)
        ip("addr", "add", f"10.201.{n}.2/24", "dev", outer)
        ip("link", "set", outer, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"10.201.{n}.1/24", "dev", inner)
        ip("netns", "exec", name, "ip", "link", "set", inner, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield {"ns": name, "inner_ip": f"10.201.{n}.1", "outer_ip": f"10.201.{n}.2",
               "outer": outer}
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def unix_redis(tmp_path):
    """A Redis of the test's own on a Unix socket."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server to give the namespaced broker a Redis")
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock),
                             "--unixsocketperm", "700", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(sock.exists, 30, "redis-server's socket")
    yield f"unix://{sock}?db=0"
    proc.terminate()
    proc.wait(timeout=scaled(10))


PUBLISHER = """
import json, sys
sys.path.insert(0, {root!r})
from tests.support.smqp_session import Session, smuid_of
with Session({host!r}, {port}, "bob") as s:
    print(json.dumps([smuid_of(s.publish("/news/d1", f"cut{{i}}", [("Depth", "1")]))
                      for i in range({n})]))
"""


def publish_inside(prefix: list[str], host: str, port: int, n: int) -> list[int]:
    """Publish ``n`` messages to A from inside its namespace."""
    from tests.conftest import ROOT

    out = subprocess.run([*prefix, sys.executable, "-c", PUBLISHER.format(
        root=str(ROOT), host=host, port=port, n=n)], capture_output=True, text=True,
        timeout=scaled(300), cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_links_cross_a_veth_pair_and_survive_the_cable_pulled(netns, unix_redis, tmp_path):
    env = {"REDIS_URL": unix_redis, "CELERY_BROKER_URL": unix_redis}
    in_ns = ["ip", "netns", "exec", netns["ns"]]
    with prepared("sqlite", tmp_path, ("a", "b"), extra_env=env) as domains:
        a, b = domains["a"], domains["b"]
        a.start_listener(port=7200, host=netns["inner_ip"], prefix=in_ns)
        b.start_listener(port=7200, host=netns["outer_ip"])
        link_all(domains, prefix={"a": in_ns})
        assert (a.host, b.host) == (netns["inner_ip"], netns["outer_ip"])
        bob = subscribe(b, "/a/news/d1")
        wait_subscribed(b, "a", "/news/d1")
        origins = [f"a.test/{n}" for n in publish(a, "/news/d1", 1, n=20, tag="veth")]
        for _ in origins[:5]:
            bob.message(timeout=120)
            bob.ack()
        # The cable pulled mid-stream: A publishes on (from inside its namespace, the only
        # side that can reach it now); what B has not stored and ACKed waits at A.
        ip("link", "set", netns["outer"], "down")
        origins += [f"a.test/{n}" for n in publish_inside(in_ns, a.host, a.port, 20)]
        time.sleep(scaled(2))  # not an assertion: the outage lasts a while
        ip("link", "set", netns["outer"], "up")
        wait_for(lambda: len(stored_origins(b, "/a/news/d1")) >= len(origins), 300,
                 "B to catch up after the outage", interval=0.5)
        wait_for(lambda: state(a)["b"]["backlog"] == 0 and state(b)["a"]["backlog"] == 0,
                 120, "both backlogs to empty")
        assert [r[1] for r in stored_origins(b, "/a/news/d1")] == origins
        got = []
        while not set(origins[5:]) <= set(got):
            got.append(header(bob.message(timeout=120), "X-Origin"))
            bob.ack()
        assert got == origins[5:]
        # The link really was A's listener in the namespace, seen from B's side.
        peers = subprocess.run(
            ["ip", "netns", "exec", netns["ns"], "ss", "-tn", "state", "established"],
            capture_output=True, text=True).stdout
        assert f"{netns['inner_ip']}:7200" in peers and netns["outer_ip"] in peers
        bob.close()
