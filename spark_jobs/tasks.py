"""The Celery task beat triggers nightly (a django-celery-beat PeriodicTask, editable in the
admin): yesterday's report. Two beats firing it run it once (the day's unique report row)."""

from __future__ import annotations

import logging
from datetime import date, timedelta

from django.utils import timezone

from broker.celery import app

from .runner import run_report

logger = logging.getLogger(__name__)
TASK_NAME = "spark_jobs.nightly_usage_report"


@app.task(name=TASK_NAME)
def nightly_usage_report(day: str | None = None, master: str | None = None) -> str:
    """The report of ``day`` (ISO date; default yesterday, UTC)."""
    when = date.fromisoformat(day) if day else timezone.now().date() - timedelta(days=1)
    report = run_report(when, master=master, trigger="beat",
                        progress=lambda text: logger.info("usage report %s: %s", when, text),
                        detail=lambda text: logger.debug("usage report %s: %s", when, text))
    return f"{when}: {'done' if report else 'skipped (already claimed)'}"
