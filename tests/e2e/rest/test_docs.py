"""Issue 24: the interactive API docs (Swagger UI from drf-spectacular-sidecar, served by the
broker itself: no CDN) render in headless Chromium against a real Daphne, list the API's
operations, and run one with a bearer token ("Try it out"). Screenshots go to
``test-artifacts/api/``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.console.test_browser_admin import CHROMIUM, browser  # noqa: F401 (a fixture)
from tests.support.api_stack import ApiStack, api_stack
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

ARTIFACTS = ROOT / "test-artifacts" / "api"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[ApiStack]:
    if not CHROMIUM.exists():
        raise RuntimeError("chromium and chromium-driver are not installed (make test "
                           "installs them)")
    setup = ("from broker.services import topics as ts\n"
             "from ual.resolution import AccessSnapshot\n"
             "ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), "
             "'/docs_demo')\n")
    with api_stack("sqlite", tmp_path_factory.mktemp("api-docs"), setup,
                   users=("root",)) as s:
        yield s


def shot(browser, name: str) -> Path:  # noqa: F811
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(800, min(int(height) + 40, 6000)))
    path = ARTIFACTS / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    return path


def wait(condition, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_docs_page_renders_locally_and_runs_a_request(stack, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    browser.get(stack.http + "/api/docs/")
    blocks = wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".opblock"), what="operations")
    assert len(blocks) >= 20
    assert "SMQP broker REST API" in browser.find_element(By.CSS_SELECTOR, ".title").text
    # Everything the page loaded came from the broker itself.
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(url.startswith(stack.http) for url in loaded), loaded
    shot(browser, "01-docs")

    browser.find_element(By.CSS_SELECTOR, ".btn.authorize").click()
    field = wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".auth-container input"),
                 what="the token field")[0]
    field.send_keys(stack.tokens["root"])
    browser.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .authorize").click()
    browser.find_element(By.CSS_SELECTOR, ".btn-done").click()

    summary = browser.find_element(By.ID, "operations-v1-topics_list")
    summary.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait(lambda: summary.find_elements(By.CSS_SELECTOR, ".try-out__btn"), what="try it out")[
        0].click()
    wait(lambda: summary.find_elements(By.CSS_SELECTOR, ".execute"), what="execute")[0].click()
    status = wait(lambda: [e for e in summary.find_elements(
        By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status") if e.text.strip()],
        what="the response")[0]
    assert status.text.strip().startswith("200")
    body = summary.find_element(By.CSS_SELECTOR, ".live-responses-table .microlight").text
    assert "/docs_demo" in body
    summary.location_once_scrolled_into_view  # noqa: B018 (scrolls the response into view)
    shot(browser, "02-try-it-out")
