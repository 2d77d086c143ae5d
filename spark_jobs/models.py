"""The stored usage reports: one :class:`UsageReport` per UTC day (unique: two triggers of
one night cannot both run it) and the rows the Spark job computed for it."""

from __future__ import annotations

import math
from datetime import UTC, datetime, time, timedelta

from django.db import models


class UsageReport(models.Model):
    class State(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    day = models.DateField(unique=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    step = models.CharField(max_length=200, blank=True, help_text="What the run is doing now.")
    master = models.CharField(max_length=200, blank=True)
    trigger = models.CharField(max_length=40, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    export_seconds = models.FloatField(null=True, blank=True)
    job_seconds = models.FloatField(null=True, blank=True)
    events = models.BigIntegerField(default=0)
    sessions_peak = models.IntegerField(default=0)
    subscribers_peak = models.IntegerField(default=0)
    # 24 values each: the most open at once in each UTC hour.
    sessions_hourly = models.JSONField(default=list, blank=True)
    subscribers_hourly = models.JSONField(default=list, blank=True)
    purged = models.BigIntegerField(default=0, help_text="Raw events of the day deleted.")
    purged_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # A report of a day not over yet (runreport --partial): it counts the events up to
    # ``until``, its hours after that are left out, and the nightly run replaces it.
    partial = models.BooleanField(default=False)
    until = models.DateTimeField(null=True, blank=True, help_text="The end of what it counts.")
    # The run that has the row: who (host and pid), its token (a run taken over may not
    # store its results over its successor's), and when it last said it was alive; a running
    # row whose heartbeat is older than SMQP_REPORT_STALE_SECONDS is taken over.
    owner = models.CharField(max_length=200, blank=True)
    token = models.CharField(max_length=32, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"usage report {self.day}" + (" (partial)" if self.partial else "")

    def hours_covered(self) -> int:
        """How many of the day's hours (from 00:00 UTC) the report counts: 24, or those a
        partial report's ``until`` has begun."""
        if not self.partial or self.until is None:
            return 24
        start = datetime.combine(self.day, time(0), tzinfo=UTC)
        return max(0, min(24, math.ceil((self.until - start) / timedelta(hours=1))))


class UsageRow(models.Model):
    """Counters of one key of one dimension, for one hour (0-23, UTC) or the day (null)."""

    class Dimension(models.TextChoices):
        TOTAL = "total", "whole server"
        SUBTREE = "subtree", "topic subtree"
        TOPIC = "topic", "topic"
        ACCOUNT = "account", "account"
        DOOR = "door", "door"

    report = models.ForeignKey(UsageReport, on_delete=models.CASCADE, related_name="usage")
    dim = models.CharField(max_length=16, choices=Dimension.choices)
    key = models.CharField(max_length=1024, blank=True)
    hour = models.SmallIntegerField(null=True, blank=True)
    published = models.BigIntegerField(default=0)
    delivered = models.BigIntegerField(default=0)
    acked = models.BigIntegerField(default=0)
    expired = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)
    republished = models.BigIntegerField(default=0)
    bytes_in = models.BigIntegerField(default=0)
    bytes_out = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["report", "dim", "hour"])]


class LatencyRow(models.Model):
    """publish→ACK latency of one topic over the day (topic "": every topic)."""

    report = models.ForeignKey(UsageReport, on_delete=models.CASCADE, related_name="latency")
    topic = models.CharField(max_length=1024, blank=True)
    count = models.BigIntegerField()
    p50_ms = models.FloatField()
    p95_ms = models.FloatField()
    p99_ms = models.FloatField()
    max_ms = models.FloatField()


class TopEntry(models.Model):
    report = models.ForeignKey(UsageReport, on_delete=models.CASCADE, related_name="top")
    what = models.CharField(max_length=16)  # "topic" or "account"
    rank = models.SmallIntegerField()
    key = models.CharField(max_length=1024)
    value = models.BigIntegerField()

    class Meta:
        ordering = ["what", "rank"]


class DeadLetterRow(models.Model):
    report = models.ForeignKey(UsageReport, on_delete=models.CASCADE,
                               related_name="dead_letters")
    reason = models.CharField(max_length=200, blank=True)
    topic = models.CharField(max_length=1024, blank=True)
    count = models.BigIntegerField()

    class Meta:
        ordering = ["-count", "reason", "topic"]
