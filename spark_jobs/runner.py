"""One report run: claim the day, export it, run the Spark job, store its results, purge the
raw events that are reported and older than the retention.

The claim is the day's unique :class:`UsageReport` row: whoever inserts it runs the report;
a second trigger of the same night (a second beat, a hand run) finds it and does nothing. A
failed run, a partial report and a run whose heartbeat stopped (its process was killed) may
be claimed again (an UPDATE that only one caller can win); ``again`` takes a done one too.
Each claim writes a new token: a run that was taken over finds its token gone and stores
nothing.

A day that is not over is refused, unless the report is asked for as partial: it then counts
the events up to now, is marked partial, and the nightly run replaces it with the full day.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from broker.models import UsageEvent

from .export import day_bounds, export_day
from .models import DeadLetterRow, LatencyRow, TopEntry, UsageReport, UsageRow

State = UsageReport.State
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class DayNotOver(ValueError):
    """A report asked for, not as partial, of a day that is not over (UTC)."""


class TakenOver(RuntimeError):
    """This run's claim was taken over (its heartbeat was late): it stores nothing."""


def claim(day: date, *, trigger: str, master: str, again: bool = False,
          until: datetime | None = None, progress: Progress = _quiet) -> UsageReport | None:
    """The day's report row if this caller is to run it, else None. ``until``: the end of
    what a partial report counts (None: the whole day)."""
    now = timezone.now()
    fields: dict[str, Any] = {"state": State.RUNNING, "started": now, "finished": None,
                              "error": "", "step": "claimed", "trigger": trigger,
                              "master": master, "partial": until is not None,
                              "until": until or day_bounds(day)[1],
                              "owner": f"{socket.gethostname()} pid {os.getpid()}",
                              "token": uuid.uuid4().hex, "heartbeat": now}
    try:
        with transaction.atomic():
            return UsageReport.objects.create(day=day, **fields)
    except IntegrityError:
        pass
    stale = now - timedelta(seconds=settings.SMQP_REPORT_STALE_SECONDS)
    takeable = (Q(state=State.FAILED) | Q(state=State.DONE, partial=True)
                | Q(state=State.RUNNING, heartbeat__lt=stale)
                | Q(state=State.RUNNING, heartbeat__isnull=True, started__lt=stale))
    if again:
        takeable |= Q(state=State.DONE)
    with transaction.atomic():
        before = UsageReport.objects.filter(day=day).values(
            "state", "owner", "heartbeat", "started").first()
        if not UsageReport.objects.filter(takeable, day=day).update(**fields):
            return None
        report = UsageReport.objects.get(day=day)
        for related in (report.usage, report.latency, report.top, report.dead_letters):
            related.all().delete()
    if before and before["state"] == State.RUNNING:
        progress(f"taking over the run of {day} by {before['owner'] or 'an unknown process'}"
                 f", silent since {before['heartbeat'] or before['started']:%Y-%m-%d %H:%M:%S}"
                 " UTC")
    return report


def _mine(report: UsageReport):
    """The report's row while this run still has it."""
    return UsageReport.objects.filter(pk=report.pk, token=report.token)


class _Heartbeat(threading.Thread):
    """Tells the database every ``every`` seconds that the run is alive (see claim)."""

    def __init__(self, report: UsageReport, every: float) -> None:
        super().__init__(daemon=True, name=f"report-heartbeat-{report.day}")
        self.report, self.every = report, every
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.wait(self.every):
                _mine(self.report).update(heartbeat=timezone.now())
        finally:
            connection.close()  # this thread's own connection


def _step(report: UsageReport, text: str, progress: Progress) -> None:
    report.step = text
    if not _mine(report).update(step=text, heartbeat=timezone.now()):
        raise TakenOver(f"the run of {report.day} was taken over by another run")
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


def _store(report: UsageReport, result: dict[str, Any], hours: int) -> None:
    """Store the job's results, unless the run was taken over meanwhile (then TakenOver and
    nothing stored). A partial report keeps the first ``hours`` hours' peaks."""
    with transaction.atomic():
        if not _mine(report).select_for_update().exists():
            raise TakenOver(f"the run of {report.day} was taken over by another run")
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
            sessions_peak=max(result["sessions"]["hours"][:hours], default=0),
            sessions_hourly=result["sessions"]["hours"][:hours],
            subscribers_peak=max(result["subscribers"]["hours"][:hours], default=0),
            subscribers_hourly=result["subscribers"]["hours"][:hours])


def run_report(day: date, *, master: str | None = None, trigger: str = "manual",
               again: bool = False, partial: bool = False, now: datetime | None = None,
               spark: Any = None, progress: Progress = _quiet,
               detail: Progress = _quiet) -> UsageReport | None:
    """Run the report of ``day`` unless another run has it (then None). ``spark``: a session
    to use (kept open); else one is started on ``master`` (``SPARK_MASTER``) and stopped.
    A day not over by ``now`` raises DayNotOver, unless ``partial``: then the report counts
    what happened until now. ``progress`` hears one line per stage, ``detail`` the rest
    (counts, Spark's tasks)."""
    master = master or settings.SPARK_MASTER
    now = now or timezone.now()
    start, end = day_bounds(day)
    if start > now:
        raise DayNotOver(f"{day} has not begun (UTC): there is nothing to report")
    if end > now and not partial:
        raise DayNotOver(f"{day} is not over (UTC, now {now:%H:%M}): its report would miss "
                         "hours; ask for a partial report (runreport --partial), or wait "
                         "for the nightly run")
    until = now if end > now else None
    report = claim(day, trigger=trigger, master=master, again=again, until=until,
                   progress=progress)
    if report is None:
        progress(f"the report of {day} is done or being made by another run: nothing to do")
        return None
    hours = report.hours_covered()
    own_spark = spark is None
    workdir: Path | None = None
    heartbeat = _Heartbeat(report, max(1.0, settings.SMQP_REPORT_STALE_SECONDS / 10))
    heartbeat.start()
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f"usage-{day}-", dir=_reports_dir()))
        what = f"until {until:%H:%M:%S} UTC (partial)" if until else "(the whole day)"
        _step(report, f"exporting the events of {day} {what}", progress)
        t0 = time.monotonic()
        exported = export_day(day, str(workdir), lambda n: detail(f"  exported {n:,} events"),
                              until=until)
        export_seconds = time.monotonic() - t0
        _mine(report).update(export_seconds=export_seconds)
        detail(f"  {exported.events:,} events, {exported.prior:,} earlier publishes "
               f"({export_seconds:.1f} s)")
        spark_log = Path(_reports_dir()) / f"spark-{day}.log"
        _step(report, f"running the Spark job on {master}"
                      + (f" (Spark's own log: {spark_log})" if own_spark else ""), progress)
        t0 = time.monotonic()
        from .jobs import usage  # PySpark is imported only by the runs that need it

        if own_spark:
            with _stderr_to(spark_log):
                spark = usage.session(master,
                                      driver_memory=settings.SPARK_DRIVER_MEMORY or None,
                                      java_options=settings.SPARK_JAVA_OPTIONS or None)
        watcher = _SparkProgress(spark, detail)
        watcher.start()
        try:
            result = usage.compute(spark, str(workdir))
        finally:
            watcher.done.set()
        job_seconds = time.monotonic() - t0
        detail(f"  job done ({job_seconds:.1f} s)")
        _step(report, f"storing the results ({exported.events:,} events, job "
                      f"{job_seconds:.1f} s)", progress)
        _store(report, result, hours)
        if not _mine(report).update(state=State.DONE, step="done", finished=timezone.now(),
                                    job_seconds=job_seconds):
            raise TakenOver(f"the run of {report.day} was taken over by another run")
    except BaseException as exc:  # (a run taken over no longer has the row: no update)
        _mine(report).update(state=State.FAILED, step="failed", finished=timezone.now(),
                             error=f"{type(exc).__name__}: {exc}"[:10_000])
        raise
    finally:
        heartbeat.done.set()
        heartbeat.join()
        if own_spark and spark is not None:
            spark.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    progress("purging the reported raw events past the retention")
    purged = purge_reported(progress=detail)
    progress(f"report of {day} done{' (partial)' if until else ''}; {purged:,} raw events "
             "purged")
    report.refresh_from_db()
    return report


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Standard error goes to ``path`` while the Spark JVM starts, so that it is the JVM's
    for good: its log4j warnings, JDK notices and progress bars land in that file, not among
    the stage lines (and a failure's details stay readable there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("wb") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


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
    for report in UsageReport.objects.filter(state=State.DONE, partial=False, day__lt=before,
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
