"""``manage.py runreport [--date D] [--master M] [--again]``: run a usage report by hand."""

from __future__ import annotations

from datetime import date, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from spark_jobs.runner import run_report


class Command(BaseCommand):
    help = ("Build the usage report of one UTC day with PySpark (default: yesterday), showing "
            "progress; then purge the reported raw events older than the retention.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--date", help="the day, YYYY-MM-DD (default: yesterday, UTC)")
        parser.add_argument("--master", help="Spark master (default: SPARK_MASTER, local[*])")
        parser.add_argument("--again", action="store_true",
                            help="recompute a day that is already reported")

    def handle(self, *args, **options) -> None:
        try:
            day = (date.fromisoformat(options["date"]) if options["date"]
                   else timezone.now().date() - timedelta(days=1))
        except ValueError as exc:
            raise CommandError(f"--date: {exc}") from exc

        def progress(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        try:
            report = run_report(day, master=options["master"], again=options["again"],
                                progress=progress)
        except Exception as exc:
            raise CommandError(f"the report of {day} failed: {exc}") from exc
        if report is None:
            self.stdout.write(self.style.WARNING(
                f"{day}: already reported or running (--again recomputes a done day)"))
        else:
            self.stdout.write(self.style.SUCCESS(
                f"{day}: {report.events:,} events reported (report #{report.pk})"))
