"""Issue 5, part 4: the admin console in a real browser, with SMQP following it.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium; ``make
test`` installs them) logs in to the admin served by a real Daphne, grants ``subscribe`` on
``/stocks`` to bob with the UAL entry form, and bob, logged in over SMQP to a real ``runsmqp`` on
the same database, may then subscribe to ``/stocks/ibm``. The browser deletes the entry and bob
gets 401 (he still sees the topic: he holds ``publish`` there, granted with ``manage.py grant``).
Screenshots of each step are kept under ``test-artifacts/``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    BrokerProcess,
    accounts_script,
    daphne,
    fresh_database,
    run_manage,
    start_listener,
    stop_listener,
)
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "test-artifacts" / "browser-admin"
# Propagation of a UAL change to the SMQP process: one generation poll (0.5 s) plus slack.
PROPAGATION_SECONDS = 3.0


@dataclass
class Stack:
    """Daphne (admin) and runsmqp (SMQP) on one fresh database."""

    http: str
    smqp: BrokerProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise RuntimeError("chromium and chromium-driver are not installed (make test "
                           "installs them)")
    base = tmp_path_factory.mktemp("browser")
    # A copy of the migrated template database; the accounts, topics and the grant in one
    # ``manage.py`` process (a start costs ~2 s of CPU, a ``migrate`` several).
    with fresh_database("sqlite", base) as env:
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("root", "bob") + """
from topics.models import Topic
stocks = Topic.objects.create(path="/stocks")
Topic.objects.create(path="/stocks/ibm", parent=stocks)
# bob keeps seeing /stocks without the subscribe right, so a refusal is 401, not 404.
from django.core.management import call_command
call_command("grant", "bob", "/stocks", "publish")
""")
        smqp = start_listener(env, base, name="browser-smqp")
        try:
            with daphne(env, base) as http:
                yield Stack(http, smqp)
        finally:
            stop_listener(smqp)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shoot(browser) -> Callable[[str], Path]:
    """Save a full-page screenshot as test-artifacts/browser-admin/NN-name.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    count = iter(range(1, 100))

    def save(name: str) -> Path:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, max(800, min(int(height) + 40, 4000)))
        path = ARTIFACTS / f"{next(count):02d}-{name}.png"
        assert browser.save_screenshot(str(path)), path
        return path

    return save


def wait_for(browser, css: str, timeout: float = 10.0):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, scaled(timeout)).until(
        ec.visibility_of_element_located((By.CSS_SELECTOR, css)))


def choose_autocomplete(browser, field: str, typed: str, wanted: str) -> None:
    """Pick ``wanted`` in the admin's select2 autocomplete widget for ``field``."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.find_element(By.CSS_SELECTOR, f".field-{field} .select2-selection").click()
    search = wait_for(browser, ".select2-container--open .select2-search__field")
    search.send_keys(typed)

    def option(driver):
        # select2 redraws the list when each search answer arrives (one per key typed): an
        # option found in one drawing may be gone when it is read or clicked; look again.
        for item in driver.find_elements(By.CSS_SELECTOR, ".select2-results__option"):
            if item.text.strip() == wanted:
                item.click()
                return True
        return False

    WebDriverWait(browser, scaled(10),
                  ignored_exceptions=[StaleElementReferenceException]).until(option)
    chosen = browser.find_element(By.CSS_SELECTOR, f".field-{field} .select2-selection__rendered")
    assert wanted in chosen.text


def select(browser, name: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.NAME, name)).select_by_value(value)


def css_loaded(browser) -> bool:
    """The admin's stylesheet applied (static files served): the header has its colour."""
    color = browser.execute_script(
        "return getComputedStyle(document.getElementById('header')).backgroundColor")
    return color not in ("rgba(0, 0, 0, 0)", "transparent", "")


def subscribe_reply(stack: Stack, until: Callable[[int], bool]) -> int:
    """bob's ``SUBSCRIBE MESSAGE /stocks/ibm`` reply code, asked again (on one session) until
    ``until(code)`` holds or the propagation time is over. A 200 is undone at once."""
    with RawClient(stack.smqp.host, stack.smqp.port) as bob:
        bob.login("bob", "pw")
        deadline = time.monotonic() + scaled(PROPAGATION_SECONDS)
        while True:
            reply = bob.command("SUBSCRIBE MESSAGE /stocks/ibm")
            code = int(reply[-1][:3])
            if code == 200:
                assert bob.command("UNSUBSCRIBE MESSAGE /stocks/ibm")[-1].startswith(b"200")
            if until(code) or time.monotonic() > deadline:
                return code
            time.sleep(0.1)


def test_grant_and_revoke_in_the_browser_reach_smqp(stack, browser, shoot):
    from selenium.webdriver.common.by import By

    assert subscribe_reply(stack, lambda code: True) == 401  # before: publish only

    browser.get(f"{stack.http}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("root")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(browser, "#smqp-console")
    assert css_loaded(browser), "the admin renders without its stylesheet"
    shoot("admin-index")

    browser.get(f"{stack.http}/admin/ual/ualentry/add/")
    wait_for(browser, "#ualentry_form")
    choose_autocomplete(browser, "topic", "stocks", "/stocks")
    select(browser, "right", "subscribe")
    select(browser, "effect", "allow")
    select(browser, "principal_kind", "account")
    choose_autocomplete(browser, "account", "bob", "bob")
    shoot("grant-form-filled")
    browser.find_element(By.NAME, "_save").click()
    message = wait_for(browser, ".messagelist .success")
    assert "allow subscribe to account bob on /stocks" in message.text
    shoot("granted")

    assert subscribe_reply(stack, lambda code: code == 200) == 200

    browser.get(f"{stack.http}/admin/ual/ualentry/effective-rights/?account=bob&topic=/stocks/ibm")
    row = wait_for(browser, "#right-subscribe")
    assert row.get_attribute("data-allowed") == "yes"
    assert row.get_attribute("data-level") == "/stocks"
    shoot("effective-rights-after-grant")

    browser.get(f"{stack.http}/admin/ual/ualentry/?right__exact=subscribe")
    browser.find_element(By.LINK_TEXT, "/stocks").click()
    wait_for(browser, "#ualentry_form")
    browser.find_element(By.CSS_SELECTOR, "a.deletelink").click()
    wait_for(browser, "input[type=submit]")
    shoot("delete-confirmation")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    message = wait_for(browser, ".messagelist .success")
    assert "deleted successfully" in message.text
    shoot("revoked")

    code = subscribe_reply(stack, lambda code: code != 200)
    assert code == 401, f"bob's SUBSCRIBE after the revoke answered {code}"

    browser.get(f"{stack.http}/admin/ual/ualauditlog/")
    table = wait_for(browser, "#result_list")
    rows = [r.text for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert any("root" in r and "deleted" in r and "subscribe to account bob" in r for r in rows)
    assert any("root" in r and "created" in r and "subscribe to account bob" in r for r in rows)
    assert any("manage.py grant" in r and "publish to account bob" in r for r in rows)
    shoot("audit-log")
    assert sorted(p.name for p in ARTIFACTS.glob("*.png")) == [
        "01-admin-index.png", "02-grant-form-filled.png", "03-granted.png",
        "04-effective-rights-after-grant.png", "05-delete-confirmation.png", "06-revoked.png",
        "07-audit-log.png"]
