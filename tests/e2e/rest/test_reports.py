"""``/api/v1/reports/``: the nightly usage reports over REST (Daphne, real HTTP), the same
tables as the admin's report page (spark_jobs.tables), staff only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.api_stack import ApiStack, api_stack

pytestmark = pytest.mark.e2e

# Two reported days, made as the job stores them (the job itself is tested in test_reports_*).
SETUP = """
from datetime import date
from spark_jobs.models import LatencyRow, TopEntry, UsageReport, UsageRow
for d, n in ((date(2026, 11, 22), 7), (date(2026, 11, 23), 11)):
    r = UsageReport.objects.create(day=d, state="done", trigger="runreport", events=3 * n,
                                   sessions_peak=2, subscribers_peak=n // 2)
    UsageRow.objects.create(report=r, dim="total", key="", hour=None, published=n,
                            delivered=2 * n, acked=n - 1, bytes_in=100 * n)
    UsageRow.objects.create(report=r, dim="total", key="", hour=5, published=n, acked=n - 1)
    UsageRow.objects.create(report=r, dim="door", key="smqp", hour=None, published=n)
    TopEntry.objects.create(report=r, what="topic", rank=1, key="/t", value=n)
    LatencyRow.objects.create(report=r, topic="", count=n - 1, p50_ms=1.5, p95_ms=2.5,
                              p99_ms=3.5, max_ms=4.0)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[ApiStack]:
    with api_stack("sqlite", tmp_path_factory.mktemp("api-reports"), SETUP) as s:
        yield s


def test_reports_list_newest_first_with_totals_in_pages(stack) -> None:
    with stack.client() as root:
        first = root.get("reports/", params={"limit": 1})
        assert first.status_code == 200, first.text
        page = first.json()
        assert [r["day"] for r in page["results"]] == ["2026-11-23"]
        report = page["results"][0]
        assert report["state"] == "done" and report["events"] == 33
        assert report["totals"]["published"] == 11 and report["totals"]["delivered"] == 22
        assert report["totals"]["acked"] == 10 and report["totals"]["bytes_in"] == 1100
        assert report["subscribers_peak"] == 5
        second = root.get(page["next"])
        assert [r["day"] for r in second.json()["results"]] == ["2026-11-22"]
        assert second.json()["next"] is None


def test_one_report_has_the_admin_page_tables(stack) -> None:
    with stack.client() as root:
        reply = root.get("reports/2026-11-22")
        assert reply.status_code == 200, reply.text
        tables = reply.json()["tables"]
        assert set(tables) >= {"hourly", "doors", "top-topics", "top-accounts", "latency",
                               "dead-letters", "subtrees", "topics", "accounts"}
        hourly = tables["hourly"]
        assert len(hourly["rows"]) == 24 and hourly["headers"][0] == "hour"
        assert hourly["rows"][5][:2] == ["05:00", 7]
        assert tables["top-topics"]["rows"] == [[1, "/t", 7]]
        assert tables["latency"]["rows"] == [["*", 6, 1.5, 2.5, 3.5, 4.0]]
        assert tables["doors"]["rows"][0][:2] == ["smqp", 7]


@pytest.mark.parametrize("day", ["2026-11-21", "yesterday", "2026-13-01"])
def test_no_report_for_that_day_is_a_404_problem(stack, day) -> None:
    with stack.client() as root:
        reply = root.get(f"reports/{day}")
        assert reply.status_code == 404
        assert reply.headers["content-type"].startswith("application/problem+json")
        assert reply.json()["smqp_code"] == 404


def test_reports_are_for_staff_only(stack) -> None:
    with stack.client("bob") as bob:
        assert bob.get("reports/").status_code == 403
        assert bob.get("reports/2026-11-22").status_code == 403
