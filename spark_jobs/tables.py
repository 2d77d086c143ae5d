"""The tables of a usage report, as the admin's report page shows them (and downloads them as
CSV) and the REST API's ``/api/v1/reports/{date}`` returns them: one place that reads the
report models into rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .models import UsageReport, UsageRow

METRICS = ("published", "delivered", "acked", "expired", "dead", "republished", "bytes_in",
           "bytes_out")
METRIC_HEADERS = ["published", "delivered", "ACKed", "expired", "dead", "republished",
                  "bytes in", "bytes out"]
TREND_DAYS = 30


def _usage_table(report: UsageReport, dim: str, title: str, key: str) -> dict[str, Any]:
    rows = (UsageRow.objects.filter(report=report, dim=dim, hour__isnull=True)
            .order_by("-published", "key"))
    return {"title": title, "headers": [key, *METRIC_HEADERS],
            "rows": [[r.key, *(getattr(r, m) for m in METRICS)] for r in rows]}


def report_tables(report: UsageReport) -> dict[str, dict[str, Any]]:
    """Every table of the report page, by the name its CSV link uses."""
    hourly = {r.hour: r for r in UsageRow.objects.filter(report=report, dim="total",
                                                         hour__isnull=False)}
    # A partial report has the hours it covers (sessions_hourly is cut there too).
    sessions = report.sessions_hourly or [0] * 24
    subscribers = report.subscribers_hourly or [0] * 24
    tables = {
        "hourly": {"title": "Per hour (UTC)",
                   "headers": ["hour", *METRIC_HEADERS, "sessions peak", "subscribers peak"],
                   "rows": [[f"{h:02d}:00", *(getattr(hourly[h], m) if h in hourly else 0
                                              for m in METRICS), sessions[h], subscribers[h]]
                            for h in range(report.hours_covered())]},
        "doors": _usage_table(report, "door", "Per door", "door"),
        "top-topics": {"title": "Top 10 topics (messages published)",
                       "headers": ["rank", "topic", "published"],
                       "rows": [[t.rank, t.key, t.value] for t in report.top.filter(
                           what="topic")]},
        "top-accounts": {"title": "Top 10 accounts (messages published + ACKed)",
                         "headers": ["rank", "account", "published + ACKed"],
                         "rows": [[t.rank, t.key, t.value] for t in report.top.filter(
                             what="account")]},
        "latency": {"title": "publish→ACK latency per topic (ms; all topics: \"*\")",
                    "headers": ["topic", "ACKs", "p50", "p95", "p99", "max"],
                    "rows": [[r.topic or "*", r.count, round(r.p50_ms, 1), round(r.p95_ms, 1),
                              round(r.p99_ms, 1), round(r.max_ms, 1)]
                             for r in report.latency.order_by("topic")]},
        "dead-letters": {"title": "Dead letters by reason",
                         "headers": ["reason", "topic", "count"],
                         "rows": [[d.reason, d.topic, d.count]
                                  for d in report.dead_letters.all()]},
        "subtrees": _usage_table(report, "subtree", "Per topic subtree", "subtree"),
        "topics": _usage_table(report, "topic", "Per topic", "topic"),
        "accounts": _usage_table(report, "account", "Per account", "account"),
    }
    return tables


def trend_table(until: UsageReport | None = None) -> dict[str, Any]:
    """Daily totals of the last TREND_DAYS reported days (up to ``until``'s day)."""
    reports = UsageReport.objects.filter(state=UsageReport.State.DONE, partial=False)
    if until is not None:
        reports = reports.filter(day__lte=until.day, day__gt=until.day - timedelta(TREND_DAYS))
    days = list(reports.order_by("-day")[:TREND_DAYS])[::-1]
    totals = {r["report_id"]: r for r in UsageRow.objects.filter(
        report__in=days, dim="total", hour__isnull=True).values("report_id", *METRICS)}
    rows = []
    for report in days:
        t = totals.get(report.pk, {})
        rows.append([report.day.isoformat(), *(t.get(m, 0) for m in METRICS),
                     report.sessions_peak, report.subscribers_peak])
    return {"title": f"Trend over the last {TREND_DAYS} reported days",
            "headers": ["day", *METRIC_HEADERS, "sessions peak", "subscribers peak"],
            "rows": rows}
