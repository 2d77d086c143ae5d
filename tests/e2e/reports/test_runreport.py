"""Usage reports end to end on PostgreSQL (issue 25): ``manage.py runreport`` as an operator
runs it, and the nightly trigger through Celery beat and a real worker, with two beats
firing the same day: one report row, computed once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import date
from pathlib import Path

import pytest

from tests.conftest import ROOT, fresh_database, run_manage, stop_process
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # Spark runs

RUN_DAY = date(2026, 2, 2)
BEAT_DAY = date(2026, 2, 10)  # far from RUN_DAY: their generated events do not mix


def shell(env: dict[str, str], code: str) -> str:
    return run_manage(env, "shell", "--no-imports", "-c", code).stdout


def seed(env: dict[str, str], day: date) -> None:
    shell(env, f"import datetime; from tests.support import reports_data; "
               f"reports_data.seed_database(datetime.date.fromisoformat('{day}'))")


def check(env: dict[str, str], day: date) -> list[str]:
    out = shell(env, "import datetime, json; from tests.support import reports_data; "
                     f"print(json.dumps(reports_data.check_report("
                     f"datetime.date.fromisoformat('{day}'))))")
    return json.loads(out.strip().splitlines()[-1])


def wait_for(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
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
             "SMQP_REPORTS_DIR": str(base / "reports"),
             "SMQP_CELERY_QUEUE": f"smqp-test-{uuid.uuid4().hex[:8]}"}
    with fresh_database("postgres", base, extra) as environment:
        yield environment, base


def test_runreport_by_hand_shows_progress_and_matches(env) -> None:
    environment, _ = env
    seed(environment, RUN_DAY)
    out = run_manage(environment, "runreport", "--date", str(RUN_DAY), "--master", "local[2]")
    text = out.stdout
    for step in ("exporting the events of 2026-02-02", "running the Spark job on local[2]",
                 "job done", "storing the results", "2026-02-02: "):
        assert step in text, text
    assert check(environment, RUN_DAY) == []
    again = run_manage(environment, "runreport", "--date", str(RUN_DAY))
    assert "already reported or running" in again.stdout
    bad = run_manage(environment, "runreport", "--date", "2026-02-31", check=False)
    assert bad.returncode != 0 and "--date" in bad.stderr


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
