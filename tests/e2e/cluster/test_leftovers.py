"""What an earlier run left (deploy.local.Leftovers): a start-up refuses, naming ``make
cluster-stop``, while a leftover process still runs (an etcd on the bridge's network would
serve the new Patroni an old cluster's keys), removes what is dead, and ``down`` removes
everything. Real namespaces, links and processes, under a prefix and a network of their own
(patched in deploy.local), so a cluster up in this session is not touched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import deploy.local as local
from tests.support.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

PREFIX, NET = "smqpt", "10.78.0"


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


def exists(kind: str, name: str) -> bool:
    out = subprocess.run(["ip", kind, "list"] if kind == "netns" else
                         ["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines()] if kind == "netns" else \
        [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return name in names


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the cluster tests need root (make test-cluster)")
    monkeypatch.setattr(local, "PREFIX", PREFIX)
    monkeypatch.setattr(local, "BRIDGE", f"{PREFIX}0")
    monkeypatch.setattr(local, "NET", NET)
    monkeypatch.setattr(local, "HUB", f"{NET}.1")
    # The TLS test's namespaces count as stale at once (a namespace's time cannot be set).
    monkeypatch.setattr(local, "TEST_NS_STALE_SECONDS", 0)
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()
    for ns in (f"{PREFIX}-n1", "smqpnsleft"):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", f"{PREFIX}0"], capture_output=True)


def leave_a_cluster(procs: list[subprocess.Popen]) -> None:
    """A bridge with the hub's address and a listener on it (as an etcd left running), a
    node's namespace with a process in it, and an empty TLS test namespace."""
    ip("link", "add", f"{PREFIX}0", "type", "bridge")
    ip("addr", "add", f"{NET}.1/24", "dev", f"{PREFIX}0")
    ip("link", "set", f"{PREFIX}0", "up")
    ip("netns", "add", f"{PREFIX}-n1")
    ip("netns", "add", "smqpnsleft")
    procs.append(subprocess.Popen([sys.executable, "-m", "http.server", "--bind", f"{NET}.1",
                                   "23790"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-n1", "sleep", "300"]))
    local._wait(lambda: local.Leftovers.find().listeners and
                local._netns_pids(f"{PREFIX}-n1"), scaled(30), "the leftovers to run")


def test_a_start_up_refuses_while_leftovers_run_and_down_removes_them(isolated, tmp_path):
    leave_a_cluster(isolated)
    cluster = local.LocalCluster(tmp_path / "c")
    with pytest.raises(local.ClusterError) as refused:
        cluster.up()
    assert "make cluster-stop" in str(refused.value)
    assert f"{NET}.1:23790" in str(refused.value) and f"{PREFIX}-n1" in str(refused.value)
    cluster.down()
    assert not local.Leftovers.find()
    assert all(p.wait(scaled(5)) is not None for p in isolated)
    assert not exists("netns", f"{PREFIX}-n1") and not exists("netns", "smqpnsleft")
    assert not exists("link", f"{PREFIX}0")


def test_a_start_up_removes_dead_leftovers(isolated, tmp_path):
    leave_a_cluster(isolated)
    for p in isolated:
        p.kill()
        p.wait()
    cluster = local.LocalCluster(tmp_path / "c")
    cluster._clear_leftovers()  # what up() does before it builds the network
    assert not local.Leftovers.find()
    assert not exists("netns", f"{PREFIX}-n1") and not exists("link", f"{PREFIX}0")


def test_a_young_empty_test_namespace_is_left_alone(isolated, monkeypatch):
    """The TLS test's namespace of a run going on now (made a moment ago) is not touched."""
    monkeypatch.setattr(local, "TEST_NS_STALE_SECONDS", 600)
    ip("netns", "add", "smqpnsleft")
    assert "smqpnsleft" not in local.Leftovers.find().test_namespaces
    local.Leftovers.find().remove()
    assert exists("netns", "smqpnsleft")
