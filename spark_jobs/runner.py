"""One report run: claim the day, export it, run the Spark job, store its results, purge the
raw events that are reported and older than the retention.

The claim is the day's unique :class:`UsageReport` row: whoever inserts it runs the report;
a second trigger of the same night (a second beat, a hand run) finds it and does nothing. A
failed run may be claimed again (an UPDATE that only one caller can win); ``again`` takes a
done one too.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from broker.models import UsageEvent

from .export import day_bounds, export_day
from .models import DeadLetterRow, LatencyRow, TopEntry, UsageReport, UsageRow

State = UsageReport.State
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def claim(day: date, *, trigger: str, master: str, again: bool = False) -> UsageReport | None:
    """The day's report row if this caller is to run it, else None."""
    fields: dict[str, Any] = {"state": State.RUNNING, "started": timezone.now(),
                              "finished": None, "error": "", "step": "claimed",
                              "trigger": trigger, "master": master}
    try:
        with transaction.atomic():
            return UsageReport.objects.create(day=day, **fields)
    except IntegrityError:
        pass
    states = [State.FAILED, State.DONE] if again else [State.FAILED]
    with transaction.atomic():
        if not UsageReport.objects.filter(day=day, state__in=states).update(**fields):
            return None
        report = UsageReport.objects.get(day=day)
        for related in (report.usage, report.latency, report.top, report.dead_letters):
            related.all().delete()
    return report


def _step(report: UsageReport, text: str, progress: Progress) -> None:
    report.step = text
    UsageReport.objects.filter(pk=report.pk).update(step=text)
    progress(text)


class _SparkProgress(threading.Thread):
    """Tells the active Spark stages' task counts every few seconds while the job runs."""

    def __init__(self, spark: Any, progress: Progress, every: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.tracker = spark.sparkContext.statusTracker()
        self.progress, self.every = progress, every
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    self.progress(f"  spark stage {stage_id}: {info.numCompletedTasks}/"
                                  f"{info.numTasks} tasks ({info.numActiveTasks} running)")


def _store(report: UsageReport, result: dict[str, Any]) -> None:
    with transaction.atomic():
        UsageRow.objects.bulk_create(
            [UsageRow(report=report, dim=r["dim"], key=r["key"] or "", hour=r["hour"],
                      **{m: r[m] or 0 for m in ("published", "delivered", "acked", "expired",
                                                "dead", "republished", "bytes_in",
                                                "bytes_out")})
             for r in result["usage"]], batch_size=2000)
        LatencyRow.objects.bulk_create([
            LatencyRow(report=report, topic=r["topic"], count=r["count"], p50_ms=r["p50"],
                       p95_ms=r["p95"], p99_ms=r["p99"], max_ms=r["max"])
            for r in result["latency"]])
        TopEntry.objects.bulk_create([TopEntry(report=report, **r) for r in result["top"]])
        DeadLetterRow.objects.bulk_create([
            DeadLetterRow(report=report, reason=r["reason"], topic=r["topic"], count=r["count"])
            for r in result["dead"]])
        UsageReport.objects.filter(pk=report.pk).update(
            events=result["events"],
            sessions_peak=result["sessions"]["day"],
            sessions_hourly=result["sessions"]["hours"],
            subscribers_peak=result["subscribers"]["day"],
            subscribers_hourly=result["subscribers"]["hours"])


def run_report(day: date, *, master: str | None = None, trigger: str = "manual",
               again: bool = False, spark: Any = None,
               progress: Progress = _quiet) -> UsageReport | None:
    """Run the report of ``day`` unless another run has it (then None). ``spark``: a session
    to use (kept open); else one is started on ``master`` (``SPARK_MASTER``) and stopped."""
    master = master or settings.SPARK_MASTER
    report = claim(day, trigger=trigger, master=master, again=again)
    if report is None:
        progress(f"the report of {day} is done or being made by another run: nothing to do")
        return None
    own_spark = spark is None
    workdir: Path | None = None
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f"usage-{day}-", dir=_reports_dir()))
        _step(report, f"exporting the events of {day}", progress)
        t0 = time.monotonic()
        exported = export_day(day, str(workdir),
                              lambda n: progress(f"  exported {n:,} events"))
        export_seconds = time.monotonic() - t0
        UsageReport.objects.filter(pk=report.pk).update(export_seconds=export_seconds)
        progress(f"  {exported.events:,} events, {exported.prior:,} earlier publishes "
                 f"({export_seconds:.1f} s)")
        _step(report, f"running the Spark job on {master}", progress)
        t0 = time.monotonic()
        from .jobs import usage  # PySpark is imported only by the runs that need it

        if own_spark:
            spark = usage.session(master, driver_memory=settings.SPARK_DRIVER_MEMORY or None)
        watcher = _SparkProgress(spark, progress)
        watcher.start()
        try:
            result = usage.compute(spark, str(workdir))
        finally:
            watcher.done.set()
        job_seconds = time.monotonic() - t0
        progress(f"  job done ({job_seconds:.1f} s)")
        _step(report, "storing the results", progress)
        _store(report, result)
        UsageReport.objects.filter(pk=report.pk).update(
            state=State.DONE, step="done", finished=timezone.now(), job_seconds=job_seconds)
    except BaseException as exc:
        UsageReport.objects.filter(pk=report.pk).update(
            state=State.FAILED, step="failed", finished=timezone.now(),
            error=f"{type(exc).__name__}: {exc}"[:10_000])
        raise
    finally:
        if own_spark and spark is not None:
            spark.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    purged = purge_reported(progress=progress)
    progress(f"report of {day} done; {purged:,} raw events purged")
    report.refresh_from_db()
    return report


def _reports_dir() -> str:
    path = Path(settings.SMQP_REPORTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def purge_reported(today: date | None = None, progress: Progress = _quiet) -> int:
    """Delete the raw usage events of every reported day older than
    ``SMQP_USAGE_RETENTION_DAYS`` (an hour per statement). Days without a done report keep
    theirs: nothing is deleted before it is counted."""
    today = today or timezone.now().date()
    before = today - timedelta(days=settings.SMQP_USAGE_RETENTION_DAYS)
    total = 0
    for report in UsageReport.objects.filter(state=State.DONE, day__lt=before,
                                             purged_at__isnull=True).order_by("day"):
        start, _ = day_bounds(report.day)
        count = 0
        for hour in range(24):
            a, b = start + timedelta(hours=hour), start + timedelta(hours=hour + 1)
            # The usage log is append-only for everything but this: a QuerySet delete (one
            # DELETE statement, no instance delete) of rows already reported.
            count += UsageEvent.objects.filter(at__gte=a, at__lt=b).delete()[0]
        UsageReport.objects.filter(pk=report.pk).update(purged=count,
                                                        purged_at=timezone.now())
        progress(f"  purged {count:,} raw events of {report.day}")
        total += count
    return total
