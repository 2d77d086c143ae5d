"""The usage report pages (issue 25) in headless Chromium against a real Daphne: three days
reported by ``manage.py runreport``, the list with the 30-day trend, a report page with its
charts and tables, and a table's CSV as the browser's session downloads it. Screenshots are
kept under ``test-artifacts/reports/``."""

from __future__ import annotations

import csv
import io
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from tests.conftest import ROOT, accounts_script, daphne, fresh_database, run_manage
from tests.e2e.console.test_browser_admin import CHROMEDRIVER, CHROMIUM, browser, css_loaded  # noqa: F401
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # three Spark runs

ARTIFACTS = ROOT / "test-artifacts" / "reports"
DAYS = [(date(2026, 1, 10), 200, 1), (date(2026, 1, 11), 450, 2), (date(2026, 1, 12), 320, 3)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise RuntimeError("chromium and chromium-driver are not installed (make test "
                           "installs them)")
    base = tmp_path_factory.mktemp("reports-browser")
    extra = {"SMQP_USAGE_RETENTION_DAYS": "100000", "SPARK_MASTER": "local[2]"}
    script = accounts_script("root") + "\nimport datetime\nfrom tests.support import reports_data\n"
    for day, publishes, seed in DAYS:
        script += (f"reports_data.seed_database(datetime.date.fromisoformat('{day}'), "
                   f"{publishes}, {seed})\n")
    # The three ``runreport`` runs in the one process that seeded the days: each run starts
    # and stops its own Spark session as on the command line, but the JVM starts once
    # (a JVM and a Django start per run cost more than the three Spark jobs).
    script += "from django.core.management import call_command\n"
    for day, _, _ in DAYS:
        script += f"call_command('runreport', '--date', '{day}')\n"
    # A copy of the migrated template database, not a ``migrate`` of its own.
    with fresh_database("sqlite", base, extra) as env:
        run_manage(env, "shell", "--no-imports", "-c", script)
        with daphne(env, base) as http:
            yield http, env


def shot(browser, name: str) -> Path:  # noqa: F811
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(800, min(int(height) + 40, 6000)))
    path = ARTIFACTS / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    return path


def test_report_pages_in_chromium(site, browser) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    http, _ = site
    browser.get(f"{http}/admin/login/?next=/admin/spark_jobs/usagereport/")
    browser.find_element(By.NAME, "username").send_keys("root")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, scaled(30)).until(ec.visibility_of_element_located(
        (By.CSS_SELECTOR, ".usage-trend svg")))
    assert css_loaded(browser)
    # The trend: one point per reported day, per series (published, ACKed, dead).
    points = browser.find_elements(By.CSS_SELECTOR, ".usage-trend svg circle")
    assert len(points) == 3 * len(DAYS)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == len(DAYS)
    shot(browser, "01-report-list")

    browser.find_element(By.LINK_TEXT, "Jan. 11, 2026").click()
    WebDriverWait(browser, scaled(30)).until(ec.visibility_of_element_located(
        (By.CSS_SELECTOR, "#usage-report svg rect")))
    assert "Usage report 2026-01-11" in browser.page_source
    assert browser.find_element(By.ID, "report-state").text.startswith("done")
    # 24 hours x 3 series of bars, and the tables filled by the job.
    bars = browser.find_elements(By.CSS_SELECTOR, "#usage-report .charts svg rect title")
    assert len(bars) == 24 * 3
    top = browser.find_elements(By.CSS_SELECTOR, "#table-top-topics tbody tr")
    assert 1 < len(top) <= 10
    latency = browser.find_elements(By.CSS_SELECTOR, "#table-latency tbody tr")
    assert latency and "nothing" not in latency[0].text
    doors = browser.find_element(By.ID, "table-doors").text
    assert "smqp" in doors and "qqp" in doors
    shot(browser, "02-report-page")

    # The per-account table as CSV, with the browser's session cookie.
    link = browser.find_element(By.CSS_SELECTOR, "#table-accounts a.csv-link")
    href = link.get_attribute("href")
    cookie = browser.get_cookie("sessionid")["value"]
    request = urllib.request.Request(href, headers={"Cookie": f"sessionid={cookie}"})
    with urllib.request.urlopen(request, timeout=scaled(30)) as reply:
        assert reply.headers["Content-Type"].startswith("text/csv")
        table = list(csv.reader(io.StringIO(reply.read().decode())))
    assert table[0][:3] == ["account", "published", "delivered"]
    shown = browser.find_elements(By.CSS_SELECTOR, "#table-accounts tbody tr")
    assert len(table) - 1 == len(shown)
    assert {r[0] for r in table[1:]} >= {"alice", "bob", "carol", "dave"}
    # Without a session: the admin login, not the data.
    with urllib.request.urlopen(href, timeout=scaled(30)) as reply:
        assert "text/csv" not in reply.headers["Content-Type"]
