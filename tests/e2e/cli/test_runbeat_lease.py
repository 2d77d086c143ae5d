"""``manage.py runbeat`` on two nodes of one database: exactly one runs ``celery beat`` (the
holder of the ``celery-beat`` lease); killed with SIGKILL, its beat dies with it and the other
node starts beat once the lease lapses; a clean stop hands the lease over at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, fresh_database, stop_process
from tests.support.federation_net import wait_for
from tests.support.processes import children, cmdline
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TTL = 3.0


def beats(keepers: dict[str, subprocess.Popen]) -> dict[str, list[int]]:
    """Each live keeper's celery beat children."""
    return {name: [c for c in children(p.pid) if "celery" in cmdline(c)
                   and " beat" in cmdline(c)]
            for name, p in keepers.items() if p.poll() is None}


def running(keepers: dict[str, subprocess.Popen]) -> list[str]:
    return [name for name, pids in beats(keepers).items() if pids]


def test_one_beat_in_the_cluster_taken_over_when_its_node_dies(tmp_path):
    with fresh_database("postgres", tmp_path, {"SMQP_LEASE_SECONDS": str(TTL)}) as env:
        keepers: dict[str, subprocess.Popen] = {}
        try:
            for node in ("n1", "n2"):
                keepers[node] = subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "runbeat", "--schedule",
                     str(tmp_path / f"schedule-{node}")],
                    env={**env, "SMQP_NODE_NAME": node}, cwd=ROOT,
                    stdout=(tmp_path / f"beat-{node}.log").open("w"),
                    stderr=subprocess.STDOUT)
            first = wait_for(lambda: running(keepers), 120, "one node to run beat")
            assert len(first) == 1
            # Several renewals later it is still exactly one, the same.
            for _ in range(int(TTL * 2 / 0.25)):
                assert running(keepers) == first
                time.sleep(0.25)
            holder = first[0]
            other = "n2" if holder == "n1" else "n1"
            orphan = beats(keepers)[holder][0]
            killed_at = time.monotonic()
            keepers[holder].send_signal(signal.SIGKILL)
            keepers[holder].wait()
            wait_for(lambda: running(keepers) == [other], 60, "the other node to take over")
            took = time.monotonic() - killed_at
            print(f"beat taken over {took:.1f} s after its node was killed (lease {TTL} s)")
            # The killed node's beat did not outlive it (PR_SET_PDEATHSIG).
            wait_for(lambda: not os.path.exists(f"/proc/{orphan}") or
                     "beat" not in cmdline(orphan), 10, "the orphaned beat to die")
            # A clean stop gives the lease back: a new node takes it without waiting it out.
            keepers[holder] = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "runbeat", "--schedule",
                 str(tmp_path / "schedule-n3")], env={**env, "SMQP_NODE_NAME": "n3"}, cwd=ROOT,
                stdout=(tmp_path / "beat-n3.log").open("w"), stderr=subprocess.STDOUT)
            # A quiet window once the new keeper is up (it tries the lease right after saying
            # so, then every TTL / 3): it must not take the lease the other node holds.
            wait_for(lambda: "Beat lease keeper" in (tmp_path / "beat-n3.log").read_text(), 120,
                     "the new node's keeper to start")
            time.sleep(scaled(TTL))
            assert running(keepers) == [other]
            stop_process(keepers[other])
            wait_for(lambda: running(keepers) == [holder], 60, "the new node to take over")
        finally:
            for proc in keepers.values():
                stop_process(proc)
