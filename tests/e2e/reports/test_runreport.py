"""Usage reports end to end on PostgreSQL (issue 25): ``manage.py runreport`` as an operator
runs it, and the nightly trigger through Celery beat and a real worker, with two beats
firing the same day: one report row, computed once. Issue 36: one line per stage and none
of Spark's own output; a day not over refused, or reported as partial; a run killed outright
taken over once its heartbeat is stale."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from tests.conftest import ROOT, fresh_database, run_manage, stop_process
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # Spark runs

RUN_DAY = date(2026, 2, 2)
BEAT_DAY = date(2026, 2, 10)  # far from RUN_DAY: their generated events do not mix
KILL_DAY = date(2026, 2, 20)


def shell(env: dict[str, str], code: str) -> str:
    return run_manage(env, "shell", "--no-imports", "-c", code).stdout


def seed(env: dict[str, str], day: date) -> None:
    shell(env, f"import datetime; from tests.support import reports_data; "
               f"reports_data.seed_database(datetime.date.fromisoformat('{day}'))")


def check(env: dict[str, str], day: date) -> list[str]:
    out = shell(env, "import datetime, json; from tests.support import reports_data; "
                     "print(json.dumps(reports_data.check_report("
                     f"datetime.date.fromisoformat('{day}'))))")
    return json.loads(out.strip().splitlines()[-1])


def wait_for(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(scaled(1))
    tail = log.read_text()[-4000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports-e2e")
    extra = {"SPARK_MASTER": "local[2]", "SMQP_USAGE_RETENTION_DAYS": "100000",
             "SMQP_REPORTS_DIR": str(base / "reports")}
    with fresh_database("postgres", base, extra) as environment:
        yield environment, base


def test_runreport_by_hand_shows_progress_and_matches(env) -> None:
    environment, _ = env
    seed(environment, RUN_DAY)
    out = run_manage(environment, "runreport", "--date", str(RUN_DAY), "--master", "local[2]")
    # One line per stage, and nothing of Spark's own (progress bars, log4j warnings).
    stages = ["exporting the events of 2026-02-02 (the whole day)",
              "running the Spark job on local[2]", "storing the results (",
              "purging the reported raw events past the retention",
              "report of 2026-02-02 done; ", "2026-02-02: "]
    lines = out.stdout.splitlines()
    assert len(lines) == len(stages), out.stdout
    for line, stage in zip(lines, stages, strict=True):
        assert line.startswith(stage), out.stdout
    assert out.stderr.strip() == "", out.stderr
    assert check(environment, RUN_DAY) == []
    again = run_manage(environment, "runreport", "--date", str(RUN_DAY))
    assert "already reported or running" in again.stdout
    bad = run_manage(environment, "runreport", "--date", "2026-02-31", check=False)
    assert bad.returncode != 0 and "--date" in bad.stderr


def test_a_day_not_over_is_refused_or_reported_as_partial(env) -> None:
    environment, _ = env
    today = datetime.now(UTC).date()
    refused = run_manage(environment, "runreport", "--date", str(today), check=False)
    assert refused.returncode != 0
    assert "is not over" in refused.stderr and "--partial" in refused.stderr, refused.stderr
    future = run_manage(environment, "runreport", "--date", "2999-01-01", check=False)
    assert future.returncode != 0 and "has not begun" in future.stderr
    assert shell(environment, "from spark_jobs.models import UsageReport; "
                              f"print(UsageReport.objects.filter(day='{today}').count())"
                 ).split()[-1] == "0"
    shell(environment, "from tests.support import reports_data as r; from datetime import *; "
                       "now = datetime.now(UTC); "
                       "r.insert([r.Event(now.replace(hour=0, minute=0, second=1), 'publish', "
                       "'bob', '/p', 77, 5, {'door': 'rest', 'to': 0})])")
    hour_before = datetime.now(UTC).hour
    out = run_manage(environment, "runreport", "--date", str(today), "--partial",
                     "--master", "local[2]")
    hour_after = datetime.now(UTC).hour
    assert "(partial)" in out.stdout.splitlines()[-1], out.stdout
    data = json.loads(shell(environment, (
        "import json; from spark_jobs.models import UsageReport; from spark_jobs.tables import "
        f"report_tables; r = UsageReport.objects.get(day='{today}'); t = report_tables(r); "
        "print(json.dumps([r.state, r.partial, r.hours_covered(), len(r.sessions_hourly), "
        "len(t['hourly']['rows']), t['doors']['rows']]))")).strip().splitlines()[-1])
    assert data[:2] == ["done", True]
    # No hours that have not happened: the hourly table and peaks stop at the current hour.
    assert data[3] == data[4] == data[2] and data[2] in {hour_before + 1, hour_after + 1}
    assert data[5] == [["rest", 1, 0, 0, 0, 0, 0, 5, 0]]


def test_a_killed_run_is_taken_over_once_its_heartbeat_is_stale(env) -> None:
    environment, base = env
    seed(environment, KILL_DAY)
    stale_seconds = round(scaled(15))
    stale = {**environment, "SMQP_REPORT_STALE_SECONDS": str(stale_seconds)}
    log = base / "killed.log"
    with log.open("w") as handle:
        victim = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runreport", "--date", str(KILL_DAY),
             "--master", "local[2]"], env=stale, cwd=ROOT, stdout=handle,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "running the Spark job" in log.read_text(), 120,
                 "the run to reach Spark", log)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # the run and its Spark JVM, outright
        victim.wait()
        killed = time.monotonic()
    state = shell(environment, "from spark_jobs.models import UsageReport; "
                               f"print(UsageReport.objects.get(day='{KILL_DAY}').state)")
    assert state.split()[-1] == "running"
    # While its heartbeat is fresh it is left alone...
    busy = run_manage(stale, "runreport", "--date", str(KILL_DAY))
    assert "already reported or running" in busy.stdout, busy.stdout
    assert time.monotonic() - killed < stale_seconds - 3, "too slow to tell: raise the stale time"
    # ... once silent for SMQP_REPORT_STALE_SECONDS, the next run takes it over.
    time.sleep(max(0.0, killed + stale_seconds + 1 - time.monotonic()))
    out = run_manage(stale, "runreport", "--date", str(KILL_DAY), "--master", "local[2]")
    assert f"taking over the run of {KILL_DAY} by " in out.stdout, out.stdout
    assert f" pid {victim.pid}, silent since " in out.stdout, out.stdout
    assert check(environment, KILL_DAY) == []


def test_celery_beat_runs_the_nightly_report_once_with_two_beats(env) -> None:
    environment, base = env
    seed(environment, BEAT_DAY)
    # What an operator does in the admin's "Periodic tasks": here every 2 s, for BEAT_DAY.
    shell(environment, (
        "from django_celery_beat.models import IntervalSchedule, PeriodicTask; import json; "
        "every, _ = IntervalSchedule.objects.get_or_create(every=2, period='seconds'); "
        "t = PeriodicTask.objects.get(name='Nightly usage report'); "
        "t.crontab = None; t.interval = every; "
        f"t.kwargs = json.dumps({{'day': '{BEAT_DAY}'}}); t.save()"))
    logs = {name: base / f"{name}.log" for name in ("worker", "beat1", "beat2")}
    procs = []
    try:
        handle = logs["worker"].open("w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "broker", "worker", "--loglevel", "INFO",
             "--concurrency", "2"],
            env=environment, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT))
        for name in ("beat1", "beat2"):
            handle = logs[name].open("w")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "broker", "beat", "--loglevel", "INFO"],
                env=environment, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT))
        for name in ("beat1", "beat2"):
            wait_for(lambda n=name: "spark_jobs.nightly_usage_report" in logs[n].read_text(),
                     120, f"{name} to send the report task", logs[name])
        wait_for(lambda: f"{BEAT_DAY}: done" in logs["worker"].read_text(), 300,
                 "the worker to finish the report", logs["worker"])
        wait_for(lambda: logs["worker"].read_text().count("skipped (already claimed)") >= 2,
                 120, "further triggers to be skipped", logs["worker"])
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout=30)
    worker_log = logs["worker"].read_text()
    assert worker_log.count(f"{BEAT_DAY}: done") == 1, worker_log[-3000:]
    counts = shell(environment, (
        "from spark_jobs.models import UsageReport; "
        f"print(UsageReport.objects.filter(day='{BEAT_DAY}').count(), "
        f"UsageReport.objects.get(day='{BEAT_DAY}').trigger)"))
    assert counts.split()[-2:] == ["1", "beat"]
    assert check(environment, BEAT_DAY) == []
