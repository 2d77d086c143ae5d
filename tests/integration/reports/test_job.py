"""The usage report job (issue 25) on a generated day of events: every aggregate compared
exactly with the same report computed in plain Python (tests/reports_data.py); latency
percentiles within percentile_approx's documented rank error. One local[2] Spark session for
the module (Spark is heavy on this machine)."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import date, timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from accounts.models import Account, LoginSession
from broker.models import Subscription, UsageEvent
from spark_jobs import runner
from spark_jobs.models import DeadLetterRow, LatencyRow, TopEntry, UsageReport, UsageRow
from spark_jobs.runner import DayNotOver, TakenOver, claim, purge_reported, run_report
from spark_jobs.tables import report_tables, trend_table
from tests.conftest import ROOT
from tests.support import reports_data
from tests.support.timing import scaled

pytestmark = pytest.mark.timeout(600)  # Spark jobs, on a shared machine
DAY = date(2026, 3, 14)
METRICS = reports_data.METRICS


@pytest.fixture(scope="module")
def spark():
    from spark_jobs.jobs import usage

    session = usage.session("local[2]", app="smqp-report-tests", shuffle_partitions=4,
                            java_options=django_settings.SPARK_JAVA_OPTIONS)
    yield session
    session.stop()
    # PySpark keeps its gateway JVM for a later session, which this test process never asks
    # for: left running, it cost ~1 CPU-s a minute for the rest of the run. Its gateway
    # server exits at the end of its stdin.
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=scaled(60))
        SparkContext._gateway = SparkContext._jvm = None


def _setup_day(publishes: int = 600, seed: int = 25) -> tuple[list, dict[int, str], int, int]:
    """Accounts, sessions and subscriptions open before DAY, and the generated events."""
    accounts = {name: Account.objects.create(username=name) for name in reports_data.ACCOUNTS}
    names = {a.pk: n for n, a in accounts.items()}
    before = reports_data.day_start(DAY) - timedelta(hours=3)
    # Open at the start: 2 sessions (a third ended before it), 3 MESSAGE subscriptions.
    for i, ended in enumerate((None, None, before + timedelta(hours=1))):
        s = LoginSession.objects.create(account=accounts["bob"], guid=f"bob-old{i}")
        LoginSession.objects.filter(pk=s.pk).update(started=before, ended=ended)
    for i in range(3):
        sub = Subscription.objects.create(account=accounts["carol"], resource="MESSAGE",
                                          pattern=f"/old{i}", pattern_key=f"/old{i}")
        Subscription.objects.filter(pk=sub.pk).update(created=before)
    events = reports_data.generate(DAY, publishes, seed,
                                   {n: a.pk for n, a in accounts.items()})
    # One subscription made before the day, removed during it: open at the start.
    events.append(reports_data.Event(reports_data.day_start(DAY) + timedelta(hours=5),
                                     "unsubscribe", "dave", "/gone",
                                     detail={"created": before.isoformat()}))
    reports_data.insert(events)
    return events, names, 2, 4


def _stored_usage(report: UsageReport) -> list[dict]:
    rows = [{"dim": r.dim, "key": r.key, "hour": r.hour, **{m: getattr(r, m) for m in METRICS}}
            for r in UsageRow.objects.filter(report=report)]
    return sorted(rows, key=reports_data.usage_key)


def _check_percentile(values: list[float], p: float, got: float, accuracy: int) -> None:
    """``got`` is one of the values, its rank within n/accuracy (+1 for rounding) of p*n."""
    n = len(values)
    slack = math.ceil(n / accuracy) + 1
    target = p * n
    ranks = [i + 1 for i, v in enumerate(values) if math.isclose(v, got, abs_tol=1e-6)]
    assert ranks, f"p{p} = {got} is none of the latencies"
    assert any(abs(r - target) <= slack for r in ranks), (p, got, ranks[:3], target, slack)


@pytest.mark.django_db(transaction=True)
def test_report_matches_independent_computation(spark, tmp_path, settings) -> None:
    from spark_jobs.jobs.usage import ACCURACY

    settings.SMQP_REPORTS_DIR = str(tmp_path)
    settings.SMQP_USAGE_RETENTION_DAYS = 100_000  # keep DAY's raw events for --again
    events, names, sessions, subscribers = _setup_day()
    want = reports_data.expected(events, DAY, names, sessions, subscribers)
    progress: list[str] = []
    detail: list[str] = []
    report = run_report(DAY, spark=spark, progress=progress.append, detail=detail.append)
    assert report is not None and report.state == "done", report and report.error
    assert report.events == want["events"]
    assert [p.split()[0] for p in progress] == ["exporting", "running", "storing", "purging",
                                                "report"]
    assert any("job done" in d for d in detail)

    got_usage = _stored_usage(report)
    assert len(got_usage) == len(want["usage"])
    assert got_usage == want["usage"]
    # Spot checks that the comparison is not vacuous: the join found yesterday's publishes,
    # subtrees roll up, both doors and the unknown topic are there.
    by = {(r["dim"], r["key"], r["hour"]): r for r in got_usage}
    assert by[("total", "", None)]["published"] == sum(
        1 for e in events if e.kind == "publish" and e.at.date() == DAY)
    assert by[("subtree", "/a", None)]["published"] > by[("topic", "/a", None)]["published"]
    assert by[("door", "qqp", None)]["published"] > 0
    assert by[("topic", "(unknown)", None)]["acked"] == 1
    assert by[("total", "", None)]["bytes_out"] > 0

    dead = sorted(({"reason": d.reason, "topic": d.topic, "count": d.count}
                   for d in DeadLetterRow.objects.filter(report=report)),
                  key=lambda r: (r["reason"], r["topic"]))
    assert dead == want["dead"] and dead
    top = [{"what": t.what, "rank": t.rank, "key": t.key, "value": t.value}
           for t in TopEntry.objects.filter(report=report).order_by("what", "rank")]
    assert top == sorted(want["top"], key=lambda t: (t["what"], t["rank"]))
    assert report.sessions_peak == want["sessions"]["day"]
    assert report.sessions_hourly == want["sessions"]["hours"]
    assert report.subscribers_peak == want["subscribers"]["day"]
    assert report.subscribers_hourly == want["subscribers"]["hours"]

    latency = {r.topic: r for r in LatencyRow.objects.filter(report=report)}
    assert set(latency) == set(want["latency"])
    for topic, values in want["latency"].items():
        row = latency[topic]
        assert row.count == len(values)
        assert math.isclose(row.max_ms, values[-1], abs_tol=1e-6)
        for p, got in ((0.5, row.p50_ms), (0.95, row.p95_ms), (0.99, row.p99_ms)):
            _check_percentile(values, p, got, ACCURACY)

    # The day is claimed: a second trigger does nothing, --again recomputes the same.
    assert run_report(DAY, spark=spark) is None
    assert UsageReport.objects.filter(day=DAY).count() == 1
    again = run_report(DAY, spark=spark, again=True)
    assert again is not None and again.pk == report.pk
    assert _stored_usage(again) == want["usage"]


@pytest.mark.django_db(transaction=True)
def test_empty_day(spark, tmp_path, settings) -> None:
    settings.SMQP_REPORTS_DIR = str(tmp_path)
    report = run_report(date(2020, 1, 1), spark=spark)
    assert report is not None and report.state == "done" and report.events == 0
    assert not UsageRow.objects.filter(report=report).exists()  # no rows of zeros
    assert report.sessions_hourly == [0] * 24


def test_the_drivers_jvm_runs_with_the_java_options(spark) -> None:
    """``java_options`` reach the JVM that PySpark starts (SPARK_JAVA_OPTIONS: the tests set
    the quick compiler only, tests/settings.py)."""
    options = django_settings.SPARK_JAVA_OPTIONS.split()
    assert options, "tests/settings.py sets SPARK_JAVA_OPTIONS"
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert set(options) <= set(runtime.getInputArguments()), list(runtime.getInputArguments())


@pytest.mark.django_db(transaction=True)
def test_a_run_starts_spark_with_the_java_options_setting(tmp_path, settings,
                                                          monkeypatch) -> None:
    settings.SMQP_REPORTS_DIR = str(tmp_path)
    settings.SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -Xss2m"
    asked: dict[str, object] = {}

    class Started(Exception):
        pass

    def session(master: str, **kwargs: object) -> None:
        asked.update(kwargs, master=master)
        raise Started

    monkeypatch.setattr("spark_jobs.jobs.usage.session", session)
    with pytest.raises(Started):
        run_report(date(2022, 6, 6))
    assert asked["java_options"] == "-XX:TieredStopAtLevel=1 -Xss2m"


@pytest.mark.django_db(transaction=True)
def test_failed_run_is_recorded_and_can_be_claimed_again(tmp_path, settings,
                                                         monkeypatch) -> None:
    settings.SMQP_REPORTS_DIR = str(tmp_path)

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("spark_jobs.runner.export_day", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_report(date(2021, 5, 5))
    report = UsageReport.objects.get(day=date(2021, 5, 5))
    assert report.state == "failed" and "No space left" in report.error
    # A failed day may be claimed again (once).
    assert claim(date(2021, 5, 5), trigger="t", master="m") is not None
    assert claim(date(2021, 5, 5), trigger="t", master="m") is None


@pytest.mark.django_db(transaction=True)
def test_partial_report_of_a_day_not_over_then_the_full_day(spark, tmp_path, settings) -> None:
    """Issue 36 item 7: at 12:30 the day is refused unless partial; the partial report counts
    what happened before 12:30 and has no hours after it; the nightly run (the day over)
    replaces it with the whole day, and only a full report is purged or trended."""
    settings.SMQP_REPORTS_DIR = str(tmp_path)
    day = date(2026, 4, 1)
    start = reports_data.day_start(day)
    noon = start + timedelta(hours=12, minutes=30)
    reports_data.insert([
        reports_data.Event(start + timedelta(hours=h), "publish", "bob", "/p", 500 + h, 10,
                           {"door": "xmpp", "to": 0}) for h in (1, 12, 13, 23)])
    with pytest.raises(DayNotOver, match="is not over"):
        run_report(day, spark=spark, now=noon)
    assert not UsageReport.objects.filter(day=day).exists()
    report = run_report(day, spark=spark, now=noon, partial=True)
    assert report is not None and report.state == "done" and report.partial
    assert report.until == noon and report.hours_covered() == 13
    assert report.events == 2 and len(report.sessions_hourly) == 13
    rows = report_tables(report)
    assert [r[0] for r in rows["hourly"]["rows"]][-1] == "12:00"
    assert rows["doors"]["rows"] == [["xmpp", 2, 0, 0, 0, 0, 0, 20, 0]]
    assert day not in [r[0] for r in trend_table()["rows"]]
    full = run_report(day, spark=spark, trigger="beat")  # the nightly run: replaces it
    assert full is not None and not full.partial and full.events == 4
    assert len(report_tables(full)["hourly"]["rows"]) == 24
    assert trend_table()["rows"][-1][:2] == [day.isoformat(), 4]


@pytest.mark.django_db(transaction=True)
def test_stale_running_claim_is_taken_over_and_the_old_run_stores_nothing(settings) -> None:
    settings.SMQP_REPORT_STALE_SECONDS = 60
    day = date(2026, 4, 2)
    old = claim(day, trigger="t", master="m")
    assert old is not None
    assert claim(day, trigger="t", master="m") is None  # alive: left alone
    UsageReport.objects.filter(pk=old.pk).update(
        heartbeat=timezone.now() - timedelta(seconds=61))
    told: list[str] = []
    new = claim(day, trigger="t", master="m", progress=told.append)
    assert new is not None and new.token != old.token
    assert told and told[0].startswith(f"taking over the run of {day} by ")
    with pytest.raises(TakenOver):  # the old run, if it was only slow, finds out
        runner._store(old, {"usage": [], "latency": [], "top": [], "dead": [], "events": 1,
                            "sessions": {"hours": [0] * 24}, "subscribers": {"hours": [0] * 24}},
                      24)
    assert UsageReport.objects.get(day=day).token == new.token


@pytest.mark.django_db(transaction=True)
def test_purge_only_reported_days_past_retention(settings) -> None:
    settings.SMQP_USAGE_RETENTION_DAYS = 30
    today = date(2026, 6, 30)
    old_done, old_unreported, recent_done = date(2026, 5, 1), date(2026, 5, 2), date(2026, 6, 25)
    for d in (old_done, old_unreported, recent_done):
        reports_data.insert([reports_data.Event(reports_data.day_start(d) + timedelta(hours=h),
                                                "login", "bob") for h in (0, 12, 23)])
    for d in (old_done, recent_done):
        UsageReport.objects.create(day=d, state="done", finished=timezone.now())
    assert purge_reported(today) == 3
    days = sorted({e.date() for e in UsageEvent.objects.values_list("at", flat=True)})
    assert days == [old_unreported, recent_done]
    assert UsageReport.objects.get(day=old_done).purged == 3
    assert purge_reported(today) == 0  # a purged day is not scanned again


def test_job_code_imports_no_django() -> None:
    """The code that runs inside Spark must run where Django is not set up."""
    code = ("import sys; import spark_jobs.jobs.usage, spark_jobs.jobs.schema; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('django', 'broker', 'accounts', 'topics', 'ual')]; "
            "assert not bad, bad; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=scaled(120), env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


@pytest.mark.django_db
def test_csv_export_keeps_formulas_as_text_and_refuses_unknown_tables(admin_client) -> None:
    report = UsageReport.objects.create(day=date(2025, 7, 1), state="done")
    UsageRow.objects.create(report=report, dim="account", key="=HYPERLINK(\"x\")", hour=None,
                            published=3)
    UsageRow.objects.create(report=report, dim="total", key="", hour=None, published=3)
    page = admin_client.get(f"/admin/spark_jobs/usagereport/{report.pk}/change/")
    assert page.status_code == 200 and b"Usage report 2025-07-01" in page.content
    assert b"<svg" in page.content and b"=HYPERLINK(&quot;x&quot;)" in page.content
    reply = admin_client.get(f"/admin/spark_jobs/usagereport/{report.pk}/csv/accounts/")
    assert reply.status_code == 200 and reply["Content-Type"].startswith("text/csv")
    lines = reply.content.decode().splitlines()
    assert lines[0].startswith("account,published")
    assert lines[1].startswith("\"'=HYPERLINK(\"\"x\"\")\",3,")
    assert admin_client.get(
        f"/admin/spark_jobs/usagereport/{report.pk}/csv/nope/").status_code == 404
    assert admin_client.get("/admin/spark_jobs/usagereport/99999/csv/accounts/").status_code \
        == 404
    trend = admin_client.get("/admin/spark_jobs/usagereport/trend.csv")
    assert trend.status_code == 200 and "2025-07-01,3," in trend.content.decode()
