"""The cluster the kill and partition tests break: ``deploy.local.LocalCluster`` (3 broker
nodes in network namespaces, Patroni, Sentinel, HAProxy), started once for the run and
removed after. These tests run only when asked for (``-m cluster``, ``make test-cluster``):
they need root and some minutes. ``SMQP_CLUSTER_REUSE=1`` uses a cluster already up
(``make cluster``) and leaves it up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if "cluster" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="cluster tests run with -m cluster (make test-cluster)")
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    from deploy.local import LocalCluster

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the cluster tests need root and iproute2 (make test-cluster)")
    reuse = os.environ.get("SMQP_CLUSTER_REUSE") == "1"
    base = Path(os.environ.get("SMQP_CLUSTER_DIR", "/tmp/smqp-cluster-test"))
    # Hashes of the test accounts at the suite's iteration count (tests/settings.py): the
    # 500-session login storm measures the broker, not a million PBKDF2 rounds each. Spark's
    # JVMs (the report's, the standalone master's and workers') as in the suite's reports.
    java = os.environ.get("SPARK_JAVA_OPTIONS", "")
    c = LocalCluster(base, extra_env={"SMQP_PBKDF2_ITERATIONS": "4096",
                                      "SPARK_JAVA_OPTIONS": java,
                                      "SPARK_DAEMON_JAVA_OPTS": java})
    if reuse and (base / "state.json").exists():
        c._load()
    else:
        reuse = False
        c.up()
    try:
        from tests.support.cluster_load import SETUP

        from .xmpp_load import XMPP_SETUP

        c.manage("shell", "--no-imports", "-c", SETUP)
        c.manage("shell", "--no-imports", "-c", XMPP_SETUP)
        yield c
    finally:
        if not reuse:
            c.down(keep_logs=True)
