"""Issue 30: the operators' console in headless Chromium, with real traffic through a real
listener: the overview (charts drawn, numbers as in the store, refreshed live), a topic page
and its "publish a test message" form, closing a session from the sessions page, and
republishing a dead letter with one click. Screenshots go to test-artifacts/overview/."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.smqp.client import NotifyMessage, NotifyServer
from tests.conftest import ROOT
from tests.support.ops_stack import OpsStack, ops_stack, wait_until
from tests.support.smqp_session import Session, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "test-artifacts" / "overview"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[OpsStack]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise RuntimeError("chromium and chromium-driver are not installed (make test "
                           "installs them)")
    with ops_stack("sqlite", tmp_path_factory.mktemp("overview")) as s:
        yield s


@pytest.fixture(scope="module")
def browser(stack) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

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
        driver.get(stack.http + "/admin/login/")
        driver.find_element(By.NAME, "username").send_keys("root")
        driver.find_element(By.NAME, "password").send_keys("pw")
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shoot(browser) -> Callable[[str], Path]:
    """Save a full-page screenshot as test-artifacts/overview/NAME.png. Each name is its
    test's own (pytest-xdist may run the tests of this module in two workers at once, so
    none deletes the others' files)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def save(name: str) -> Path:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, max(800, min(int(height) + 40, 4000)))
        path = ARTIFACTS / f"{name}.png"
        assert browser.save_screenshot(str(path)), path
        return path

    return save


def cell(browser, css: str) -> str | None:
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css)
    return found.strip() if found is not None else None


def chart_sums(browser, canvas_id: str) -> dict[str, int] | None:
    """What Chart.js drew on the canvas (the finished minutes or hours), plus the current
    one so far from the caption under it: each dataset's total."""
    return browser.execute_script("""
        const c = Chart.getChart(arguments[0]);
        if (!c) return null;
        const sofar = document.getElementById(arguments[0] + "-sofar");
        const out = {};
        for (const d of c.data.datasets) {
          out[d.label] = d.data.reduce((a, b) => a + b, 0) + Number(sofar.dataset[d.label]);
        }
        return out;""", canvas_id)


def list_cut_off(browser) -> bool:
    """Does the change list scroll sideways (a column cut off) at the window's width?"""
    return browser.execute_script("""
        const r = document.querySelector('#changelist .results');
        return r.scrollWidth > r.clientWidth + 1;""")


def chart_shape(browser, canvas_id: str) -> dict | None:
    """The chart's points and labels, and the caption under it."""
    return browser.execute_script("""
        const c = Chart.getChart(arguments[0]);
        if (!c) return null;
        return {points: c.data.datasets[0].data.length, last: c.data.labels.at(-1),
                caption: document.getElementById(arguments[0] + "-sofar").textContent};""",
                                  canvas_id)


def canvas_has_ink(browser, canvas_id: str) -> bool:
    """Some pixels of the canvas are not transparent: something was drawn."""
    return browser.execute_script("""
        const c = document.getElementById(arguments[0]);
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return true;
        return false;""", canvas_id)


def test_overview_live_with_traffic(stack, browser, shoot):
    from selenium.webdriver.common.by import By

    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob, \
            Session(stack.smqp.host, stack.smqp.port, "alice") as alice:
        assert bob.command("SUBSCRIBE MESSAGE /ops/a").code == 200
        browser.get(stack.http + "/admin/")
        # The landing page: the overview above Django's own app list.
        wait_until(lambda: cell(browser, '#ops-sessions [data-door="total"]') == "2",
                   what="the overview's first fill")
        assert browser.find_elements(By.CSS_SELECTOR, "#content-main .app-accounts")
        shoot("1-overview-idle")
        # Traffic while the page is open: it refreshes by itself.
        for i in range(6):
            smuid_of(alice.publish("/ops/a", f"live-{i}"))
        for _ in range(2):
            bob.message()
            bob.ack()
        store = wait_until(lambda: (lambda r: r if r["acked"] == 2 else None)(stack.store("""
from broker.models import Delivery, Message
result = {
  "messages": Message.objects.filter(topic__path="/ops/a", state="pending").count(),
  "pending": Delivery.objects.filter(message__topic__path="/ops/a", state="pending").count(),
  "acked": Delivery.objects.filter(message__topic__path="/ops/a", state="acked").count(),
}""")), what="the ACKs in the store")
        row = '#ops-topics tr[data-topic="/ops/a"] '
        wait_until(lambda: cell(browser, row + '[data-field="pending"]') == str(store["pending"])
                   and cell(browser, '[data-total="ack"]') == "2",
                   timeout=40, what="the overview refreshed with the traffic")
        assert cell(browser, row + '[data-field="messages"]') == str(store["messages"]) == "6"
        assert cell(browser, row + '[data-field="locked"]') == "0"
        assert cell(browser, '[data-total="publish"]') == "6"
        assert cell(browser, '[data-total="deliver"]') == "3"  # 2 ACKed, 1 in flight
        assert cell(browser, '#ops-sessions [data-door="smqp"]') == "2"
        # The charts are drawn, with the counted traffic.
        sums = wait_until(lambda: (lambda s: s if s and s["ack"] == 2 else None)(
            chart_sums(browser, "ops-rate-minutes")), what="the minute chart")
        assert sums == {"publish": 6, "deliver": 3, "ack": 2}
        assert chart_sums(browser, "ops-rate-hours") == sums
        assert canvas_has_ink(browser, "ops-rate-minutes")
        assert "ops-ok" in browser.find_element(
            By.CSS_SELECTOR, '#ops-listeners [data-lane="publish"]').get_attribute("class")
        shoot("2-overview-traffic")

        # The topic page, from the overview's link.
        browser.find_element(By.CSS_SELECTOR, row + "a").click()
        wait_until(lambda: cell(browser, '#ops-topic-depth [data-field="messages"]') == "6",
                   what="the topic page")
        assert cell(browser, '#ops-topic-depth [data-field="pending"]') == str(store["pending"])
        assert "bob" in cell(browser, '#ops-subscribers tr[data-account="bob"]')
        assert chart_sums(browser, "ops-topic-rates") == {"publish": 6, "ack": 2}
        assert canvas_has_ink(browser, "ops-topic-rates")
        shoot("3-topic-page")
        # Publish a test message from the page: bob gets it.
        text = browser.find_element(By.NAME, "body")
        text.clear()
        text.send_keys("hello from the console")
        browser.find_element(By.CSS_SELECTOR, "#ops-publish-form input[type=submit]").click()
        wait_until(lambda: "Published console-" in browser.page_source,
                   what="the publish confirmation")
        shoot("4-topic-published")
        seen = []
        while "hello from the console" not in seen:
            msg = bob.message(timeout=30)
            seen.append(msg.message.sections[0].body.decode())
            bob.ack()
        wait_until(lambda: cell(browser, '#ops-topic-depth [data-field="messages"]') == "7",
                   what="the topic page's live depth")


def test_close_session_from_the_sessions_page(stack, browser, shoot):
    from selenium.webdriver.common.by import By

    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob:
        guid = stack.store(
            "from accounts.models import LoginSession\n"
            "result = LoginSession.objects.filter(account__username='bob', ended__isnull=True)"
            ".latest('started').guid")
        browser.get(stack.http + "/admin/ops/sessions/")
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-guid="{guid}"]')
        assert "SMQP" in row.text
        shoot("5-sessions")
        row.find_element(By.CSS_SELECTOR, "input.ops-close").click()
        wait_until(lambda: "is being closed" in browser.page_source, what="the confirmation")
        event = bob.notification(timeout=30)
        while isinstance(event, NotifyMessage):
            event = bob.notification(timeout=30)
        assert isinstance(event, NotifyServer) and event.kind == "BYE"
        with pytest.raises((ConnectionError, OSError)):
            bob.notification(timeout=30)
    browser.get(stack.http + "/admin/ops/sessions/")
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, f'tr[data-guid="{guid}"]')
               or browser.refresh(), what="the closed session gone from the page")
    shoot("6-sessions-after-close")


def test_republish_a_dead_letter_with_one_click(stack, browser, shoot):
    from selenium.webdriver.common.by import By

    with Session(stack.smqp.host, stack.smqp.port, "jtegen") as jtegen, \
            Session(stack.smqp.host, stack.smqp.port, "alice") as alice:
        assert jtegen.command("SUBSCRIBE MESSAGE /ops/d").code == 200
        smuid = smuid_of(alice.publish("/ops/d", "second-chance"))
        jtegen.message()  # never ACKed: sent again after 1 s, then dead
        browser.get(stack.http + "/admin/")
        button = f'#ops-dead button.ops-republish[data-smuid="{smuid}"]'
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, button), timeout=60,
                   what="the dead letter on the overview")
        shoot("7-dead-letter")
        browser.find_element(By.CSS_SELECTOR, button).click()
        wait_until(lambda: f"Message {smuid} republished" in browser.page_source,
                   what="the republish confirmation")
        shoot("8-republished")
        # jtegen gets it again (the old NOTIFY's retry may come first).
        while True:
            msg = jtegen.message(timeout=30)
            if msg.message.get("Smuid").endswith(f"/{smuid}"):
                break
        # The republish is on record. (Its state is not checked: never ACKed, with a 1 s
        # retry and one retry, the message is dead again within seconds, back in Trash.)
        republished = stack.store(
            "from broker.models import UsageEvent\n"
            f"result = UsageEvent.objects.filter(kind='republish', smuid={smuid}).count()")
        assert republished == 1


def test_links_on_the_overview(stack, browser, shoot):
    """Federation links from a real link supervisor (tests/link_supervisor.py): "loop" is
    up, "dead" (its peer's port closed) is marked down with its error; when "dead" is
    pointed at a listener it comes up on the open page, without a reload."""
    from selenium.webdriver.common.by import By

    from tests.support.link_supervisor import two_links

    with two_links(stack):
        browser.get(stack.http + "/admin/")
        loop, dead = '#ops-links tr[data-link="loop"]', '#ops-links tr[data-link="dead"]'
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, loop + '[data-state="up"]')
                   and browser.find_elements(By.CSS_SELECTOR, dead + '[data-state="down"]'),
                   timeout=90, what="loop up and dead down on the overview")
        row = browser.find_element(By.CSS_SELECTOR, dead)
        state = row.find_elements(By.CSS_SELECTOR, "td")[2]
        assert state.text == "DOWN" and "ops-bad" in state.get_attribute("class")
        error = row.find_element(By.CSS_SELECTOR, "td.ops-error").text
        assert error and "ops-bad" in row.find_element(
            By.CSS_SELECTOR, "td.ops-error").get_attribute("class")
        # The figures are the store's (the same service as the REST API's). Read first: the
        # table is refilled every few seconds, and a slow read would leave stale cells.
        store = {x["name"]: x for x in stack.store(
            "from broker.services import stats\nresult = stats.links()")}
        up = browser.find_element(By.CSS_SELECTOR, loop).find_elements(By.CSS_SELECTOR, "td")
        assert up[2].text == "up" and "ops-ok" in up[2].get_attribute("class")
        assert f"alice@{stack.smqp.host}:{stack.smqp.port}" in up[1].text
        assert up[3].text == str(store["loop"]["backlog"])
        assert browser.find_element(By.CSS_SELECTOR, dead).find_elements(
            By.CSS_SELECTOR, "td")[3].text == "\u2013"  # no peer account: no backlog figure
        shoot("7-links-one-down")
        # Repaired while the page is open: the next refresh shows it up.
        stack.smqp.manage("link", "add", "dead", "--update", "--host", stack.smqp.host,
                          "--port", str(stack.smqp.port), "--account", "alice",
                          "--password", "pw")
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, dead + '[data-state="up"]'),
                   timeout=90, what="the repaired link up on the open page")
        assert browser.find_element(By.CSS_SELECTOR, dead).find_element(
            By.CSS_SELECTOR, "td.ops-error").text == ""
        shoot("8-links-all-up")


def test_branding_deliveries_message_states_listeners_and_the_unfinished_minute(
        stack, browser, shoot):
    """Issue 36 item 4: the console is "SMQP broker" with its icon; the per-minute chart stops
    at the last finished minute and tells the current one so far; the listeners table names
    each process by its role; deliveries name their topic; a fan-out message its subscriber
    ACKed is not shown as "pending"."""
    import urllib.request
    from datetime import UTC, datetime, timedelta

    from selenium.webdriver.common.by import By

    browser.get(stack.http + "/admin/")
    assert browser.title.endswith("| SMQP broker"), browser.title
    assert browser.find_element(By.CSS_SELECTOR, "#site-name").text.strip() == "SMQP broker"
    icon = browser.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    with urllib.request.urlopen(icon, timeout=scaled(10)) as reply:
        assert reply.status == 200 and b"<svg" in reply.read()
    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob, \
            Session(stack.smqp.host, stack.smqp.port, "alice") as alice:
        assert bob.command("SUBSCRIBE MESSAGE /ops/a").code == 200
        smuid = smuid_of(alice.publish("/ops/a", "fanout-acked"))
        while True:  # (earlier tests' messages first)
            got = bob.message(timeout=30)
            bob.ack()
            if got.message.get("Smuid").rsplit("/", 1)[-1] == str(smuid):
                break
        browser.get(stack.http + "/admin/")
        shape = wait_until(lambda: chart_shape(browser, "ops-rate-minutes"),
                           what="the minute chart")
        now = datetime.now(UTC)
        assert shape["points"] == 59  # of 60 buckets: the current minute is not a point
        assert shape["last"] in {(now - timedelta(minutes=m)).strftime("%H:%M") for m in (1, 2)}
        assert shape["caption"].startswith("this minute so far: ")
        roles = wait_until(lambda: browser.execute_script(  # (the table is refilled live)
            "return [...document.querySelectorAll('#ops-listeners [data-field=\"role\"]')]"
            ".map((e) => e.textContent);") or None, what="the listeners table")
        assert "SMQP listener" in roles, roles
        shoot("7-overview-roles-and-finished-minutes")
        # The Message list: the ACKed fan-out message says so.
        browser.get(stack.http + f"/admin/broker/message/?id={smuid}")
        row = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"),
                         what="the message list")[0]
        status = row.find_element(By.CSS_SELECTOR, "td.field-status").text
        assert status.startswith("ACKed by all 1"), status
        assert "pending" not in status
        shoot("8-message-acked-fan-out")
        assert not list_cut_off(browser)
        # The topic page's latest messages too.
        browser.get(stack.http + "/admin/ops/topic/?path=/ops/a")
        states = [e.text for e in browser.find_elements(
            By.CSS_SELECTOR, '#ops-recent [data-field="status"]')]
        assert states and states[0].startswith("ACKed by all 1"), states
        # Deliveries name the topic path.
        browser.get(stack.http + f"/admin/broker/delivery/?message__id__exact={smuid}")
        topics = [e.text for e in browser.find_elements(
            By.CSS_SELECTOR, "#result_list td.field-topic")]
        assert topics == ["/ops/a"], topics
        # Fitting the list does not cut a word in two: "acknowledged" is on one line.
        state_lines = browser.execute_script("""
            const r = document.createRange();
            r.selectNodeContents(document.querySelector('#result_list td.field-state'));
            return [r.toString().trim(), r.getClientRects().length];""")
        assert state_lines == ["acknowledged", 1], state_lines
        shoot("9-deliveries-with-topic")
        assert not list_cut_off(browser)
        for page in ("broker/usageevent", "broker/subscription", "accounts/loginsession"):
            browser.get(f"{stack.http}/admin/{page}/")
            shoot(f"10-list-{page.replace('/', '-')}")
            assert not list_cut_off(browser), page
