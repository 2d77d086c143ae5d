"""``manage.py runbeat`` on two nodes of one database: exactly one runs ``celery beat`` (the
holder of the ``celery-beat`` lease); killed with SIGKILL, its beat dies with it and the other
node starts beat once the lease lapses; a clean stop hands the lease over at once. A live
keeper stops its beat when its lease lapses unrenewed or is taken."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.management.commands.runbeat import LEASE
from tests.conftest import (
    ROOT,
    execute_database,
    fresh_database,
    query_database,
    rows_locked,
    stop_process,
)
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


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie its keeper has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _lines(log: Path, text: str) -> int:
    return sum(text in line for line in log.read_text().splitlines())


def test_beat_stops_when_its_lease_lapses_or_is_taken_while_its_keeper_lives(tmp_path):
    """The two stops no node death shows: the fence kills beat when a renewal hangs (here
    on a row lock) past the lease's time, and a renewal that finds the lease taken stops it.
    Beat starts again only once the lease is truly held again."""
    log = tmp_path / "beat-n1.log"
    with fresh_database("postgres", tmp_path, {"SMQP_LEASE_SECONDS": str(TTL)}) as env:
        keeper = {"n1": subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runbeat", "--schedule",
             str(tmp_path / "schedule-n1")], env={**env, "SMQP_NODE_NAME": "n1"}, cwd=ROOT,
            stdout=log.open("w"), stderr=subprocess.STDOUT)}
        try:
            wait_for(lambda: running(keeper), 120, "beat to start")
            first = beats(keeper)["n1"][0]

            # A renewal stuck on the lease's row: the fence kills beat before the lease's
            # time is up, though the keeper itself never hears that it lost.
            with rows_locked(env, "SELECT holder FROM broker_cluster_lease WHERE name = %s "
                             "FOR UPDATE", (LEASE,)):
                wait_for(lambda: _lines(log, "Beat lease lapsed unrenewed") == 1, 60,
                         "the fence to kill beat")
                # The fence says so just before its kill lands.
                wait_for(lambda: not _alive(first), 10, "the fenced beat to end")
                assert keeper["n1"].poll() is None
                # Held past the waiting renewal's own fence, so its answer comes too late.
                time.sleep(TTL)
                assert not running(keeper)
            # The renewal that waited returns too late to count; the next one starts beat.
            wait_for(lambda: running(keeper), 60, "beat to start again")
            second = beats(keeper)["n1"][0]
            time.sleep(scaled(TTL))
            assert beats(keeper)["n1"] == [second], "beat restarted again: a stale hold"
            assert _lines(log, "Beat lease lapsed unrenewed") == 1
            assert "celery beat exited" not in log.read_text()

            # Another holder takes the lease: the next renewal sees it and stops beat, which
            # stays stopped while the other holds it.
            lost = _lines(log, "Beat lease lost: stopping celery beat")
            execute_database(env, "UPDATE broker_cluster_lease SET holder = 'intruder', "
                             "expires_at = now() + interval '1 hour' WHERE name = %s", (LEASE,))
            wait_for(lambda: _lines(log, "Beat lease lost: stopping celery beat") == lost + 1,
                     60, "the keeper to stop beat")
            wait_for(lambda: not _alive(second), 10, "beat to end")
            time.sleep(scaled(TTL))
            assert not running(keeper) and keeper["n1"].poll() is None

            # Given back, it is taken again.
            execute_database(env, "UPDATE broker_cluster_lease SET expires_at = "
                             "to_timestamp(0) WHERE name = %s", (LEASE,))
            wait_for(lambda: running(keeper), 60, "beat to start once the lease is free")
            stop_process(keeper["n1"])
            assert keeper["n1"].returncode == 0
            [(holder, released)] = query_database(
                env, "SELECT holder, expires_at <= to_timestamp(0) FROM broker_cluster_lease "
                "WHERE name = %s", (LEASE,))
            assert holder.startswith("n1:") and released
        finally:
            stop_process(keeper["n1"])
