"""The usage reports in the admin: the list (with the 30-day trend above it), a report page with
charts and tables, every table downloadable as CSV. Reports are made by the job, never edited
here; the nightly schedule is django-celery-beat's "Periodic tasks" entry."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse

from . import charts
from .models import UsageReport
from .tables import report_tables, trend_table


def _csv(name: str, table: dict[str, Any]) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    writer = csv.writer(response)
    writer.writerow(table["headers"])
    for row in table["rows"]:
        # A cell a spreadsheet would run as a formula (=, +, -, @) is kept as text.
        writer.writerow([f"'{c}" if isinstance(c, str) and c[:1] in "=+-@" else c
                         for c in row])
    return response


def _trend_chart(trend: dict[str, Any]):
    labels = [r[0][5:] for r in trend["rows"]]
    return charts.lines(labels, {"published": [r[1] for r in trend["rows"]],
                                 "ACKed": [r[3] for r in trend["rows"]],
                                 "dead": [r[5] for r in trend["rows"]]},
                        every=max(1, len(labels) // 10))


@admin.register(UsageReport)
class UsageReportAdmin(admin.ModelAdmin):
    list_display = ("day", "status", "events", "sessions_peak", "subscribers_peak", "export",
                    "job", "trigger", "purged")
    list_filter = ("state",)
    date_hierarchy = "day"
    change_form_template = "admin/spark_jobs/usagereport/report.html"
    change_list_template = "admin/spark_jobs/usagereport/change_list.html"

    @admin.display(description="state", ordering="state")
    def status(self, report: UsageReport) -> str:
        if report.partial and report.until is not None:
            return f"{report.get_state_display()}, partial: until {report.until:%H:%M} UTC"
        return report.get_state_display()

    @admin.display(description="export (s)", ordering="export_seconds")
    def export(self, report: UsageReport) -> str:
        return "" if report.export_seconds is None else f"{report.export_seconds:.1f}"

    @admin.display(description="job (s)", ordering="job_seconds")
    def job(self, report: UsageReport) -> str:
        return "" if report.job_seconds is None else f"{report.job_seconds:.1f}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # reports are made by the job (manage.py runreport, Celery beat)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # viewing only

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<int:pk>/csv/<slug:table>/", view(self.csv_view),
                 name="spark_jobs_usagereport_csv"),
            path("trend.csv", view(self.trend_csv_view),
                 name="spark_jobs_usagereport_trend_csv"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        trend = trend_table()
        extra = {"trend": trend, "trend_chart": _trend_chart(trend) if trend["rows"] else None,
                 **(extra_context or {})}
        return super().changelist_view(request, extra)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None):
        report = self.get_object(request, object_id)
        if report is None or not self.has_view_permission(request, report):
            raise Http404("no such report")
        tables = report_tables(report)
        hourly = tables["hourly"]["rows"]
        hours = [r[0][:2] for r in hourly]
        trend = trend_table(report)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "original": report, "report": report,
            "title": f"Usage report {report.day}",
            "tables": [(name, t, reverse("admin:spark_jobs_usagereport_csv",
                                         args=[report.pk, name]))
                       for name, t in tables.items()],
            "hourly_chart": charts.bars(hours, {"published": [r[1] for r in hourly],
                                                "delivered": [r[2] for r in hourly],
                                                "ACKed": [r[3] for r in hourly]}, every=2),
            "peaks_chart": charts.lines(hours, {"sessions": [r[9] for r in hourly],
                                                "subscribers": [r[10] for r in hourly]},
                                        every=2),
            "trend": trend, "trend_chart": _trend_chart(trend) if trend["rows"] else None,
            "trend_csv": reverse("admin:spark_jobs_usagereport_csv", args=[report.pk, "trend"]),
        }
        return TemplateResponse(request, self.change_form_template, context)

    def csv_view(self, request: HttpRequest, pk: int, table: str) -> HttpResponse:
        report = UsageReport.objects.filter(pk=pk).first()
        if report is None or not self.has_view_permission(request, report):
            raise Http404("no such report")
        if table == "trend":
            return _csv(f"usage-trend-{report.day}", trend_table(report))
        tables = report_tables(report)
        if table not in tables:
            raise Http404("no such table")
        return _csv(f"usage-{report.day}-{table}", tables[table])

    def trend_csv_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise Http404("no such report")
        return _csv("usage-trend", trend_table())
