"""``manage.py runreport [--date D] [--partial] [--master M] [--again]``: run a usage report by
hand, one line per stage (``-v 2``: the counts and Spark's task progress too)."""

from __future__ import annotations

from datetime import date, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from spark_jobs.runner import DayNotOver, run_report


class Command(BaseCommand):
    help = ("Build the usage report of one UTC day with PySpark (default: yesterday), showing "
            "one line per stage; then purge the reported raw events older than the "
            "retention. A day that is not over is refused unless --partial.")
    # Checked once by runbroker (or `manage.py check`), not by each process it starts.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--date", help="the day, YYYY-MM-DD (default: yesterday, UTC)")
        parser.add_argument("--master", help="Spark master (default: SPARK_MASTER, local[*])")
        parser.add_argument("--again", action="store_true",
                            help="recompute a day that is already reported")
        parser.add_argument("--partial", action="store_true",
                            help="a day that is not over: report what happened until now, "
                                 "marked partial (the nightly run replaces it)")

    def handle(self, *args, **options) -> None:
        try:
            day = (date.fromisoformat(options["date"]) if options["date"]
                   else timezone.now().date() - timedelta(days=1))
        except ValueError as exc:
            raise CommandError(f"--date: {exc}") from exc

        def progress(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        detail = progress if options["verbosity"] >= 2 else (lambda text: None)
        try:
            report = run_report(day, master=options["master"], again=options["again"],
                                partial=options["partial"], progress=progress, detail=detail)
        except DayNotOver as exc:
            raise CommandError(str(exc)) from exc
        except Exception as exc:
            raise CommandError(f"the report of {day} failed: {exc}") from exc
        if report is None:
            self.stdout.write(self.style.WARNING(
                f"{day}: already reported or running (--again recomputes a done day)"))
        else:
            what = f" until {report.until:%H:%M:%S} UTC (partial)" if report.partial else ""
            self.stdout.write(self.style.SUCCESS(
                f"{day}: {report.events:,} events reported{what} (report #{report.pk})"))
