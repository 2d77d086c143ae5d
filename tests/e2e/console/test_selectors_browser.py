"""Issue 26 in the admin, in a real browser: a subscription made over SMQP with a selector and a
lease shows both in the admin's subscription list (Daphne and runsmqp on one database, from
tests/e2e/console/test_browser_admin.py), and a selector typed into the admin is checked as SUB
checks it. Screenshots under ``test-artifacts/selectors/``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.console.test_browser_admin import browser, stack, wait_for  # noqa: F401 (fixtures)
from tests.support.smqp_client import RawClient

pytestmark = pytest.mark.e2e

ARTIFACTS = ROOT / "test-artifacts" / "selectors"


@pytest.fixture(scope="module")
def shoot(browser) -> Callable[[str], Path]:  # noqa: F811 (the fixture above)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    count = iter(range(1, 100))

    def save(name: str) -> Path:
        path = ARTIFACTS / f"{next(count):02d}-{name}.png"
        assert browser.save_screenshot(str(path)), path
        return path

    return save


def test_the_admin_shows_selector_and_lease_end(stack, browser, shoot):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with RawClient(stack.smqp.host, stack.smqp.port) as root:
        root.login("root", "pw")
        reply = root.command(
            "SUB MESSAGE /stocks/ibm LEASE 01:00:00 SELECTOR JMS X_Region = 'emea'")
        assert reply[-1] == b"200 /stocks/ibm\r\n", reply

    browser.get(f"{stack.http}/admin/login/?next=/admin/broker/subscription/")
    browser.find_element(By.NAME, "username").send_keys("root")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    table = wait_for(browser, "#result_list")
    headers = [th.text.strip().upper() for th in table.find_elements(By.CSS_SELECTOR, "th")]
    assert "SELECTOR" in headers and "LEASE END" in headers, headers
    row = table.find_element(By.CSS_SELECTOR, "tbody tr")
    assert "JMS X_Region = 'emea'" in row.text
    assert "/stocks/ibm" in row.text
    shoot("subscription-list")

    browser.get(f"{stack.http}/admin/broker/subscription/add/")
    wait_for(browser, "#subscription_form")
    browser.find_element(By.NAME, "account").send_keys("1")
    browser.find_element(By.NAME, "pattern").send_keys("/stocks/ibm")
    Select(browser.find_element(By.NAME, "resource")).select_by_value("MESSAGE")
    Select(browser.find_element(By.NAME, "selector_class")).select_by_value("RFC-2254")
    browser.find_element(By.NAME, "selector").send_keys("(x-region=emea")
    browser.find_element(By.NAME, "_save").click()
    error = wait_for(browser, ".errornote, .errorlist")
    page = browser.page_source
    assert "Incorrect message selector (unexpected end at column 15)" in page, error.text
    shoot("selector-refused")
