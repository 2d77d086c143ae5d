"""Issue 36, item 4 (the part that shares item 1's services): the console's sessions page
with messages in/out, unacked, locked and rates, and a topic page listing its consumers
with backlog and lag, in headless Chromium against a real listener. Screenshots go to
test-artifacts/overview/ (36-*.png)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.console.test_browser_overview import browser, cell, shoot, stack  # noqa: F401
from tests.support.ops_stack import wait_until
from tests.support.smqp_session import Session, smuid_of

pytestmark = pytest.mark.e2e


def test_sessions_page_shows_the_counters(stack, browser, shoot):  # noqa: F811
    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob, \
            Session(stack.smqp.host, stack.smqp.port, "alice") as alice:
        assert bob.command("SUB MESSAGE /ops/a").code == 200
        for i in range(3):
            smuid_of(alice.publish("/ops/a", f"counted-{i}"))
        for _ in range(2):
            bob.message()
            bob.ack()
        bob.message()  # the third stays unACKed
        guid = stack.store(
            "from accounts.models import LoginSession\n"
            "result = LoginSession.objects.filter(account__username='bob', ended__isnull=True)"
            ".latest('started').guid")

        def row_text(field: str) -> str | None:
            return cell(browser, f'tr[data-guid="{guid}"] [data-field="{field}"]')

        def counted() -> bool:
            browser.get(stack.http + "/admin/ops/sessions/")
            return row_text("messages_out") == "3" and row_text("unacked") == "1"

        wait_until(counted, what="bob's counters on the sessions page")
        headers = browser.execute_script(  # textContent: CSS shows them upper-cased
            "return [...document.querySelectorAll('#ops-session-list thead th')]"
            ".map(th => th.textContent.trim());")
        assert headers[:12] == ["guid", "account", "door", "login", "client", "since", "in",
                                "out", "unacked", "locked", "in/s", "out/s"]
        assert float(row_text("rate_out")) > 0
        # (In one script: the page reloads itself every 10 s, which would leave a found
        # element stale.)
        alice_in = browser.execute_script(
            "for (const tr of document.querySelectorAll('#ops-session-list tr[data-guid]'))"
            "  if (tr.cells[1].textContent.trim() === 'alice')"
            "    return tr.querySelector('[data-field=messages_in]').textContent.trim();"
            "return null;")
        assert alice_in == "3"
        # No column cut off: the table fits the 1,400 px window.
        assert browser.execute_script(
            "const t = document.getElementById('ops-session-list');"
            "return t.getBoundingClientRect().right <= window.innerWidth;")
        shoot("36-sessions-counters")


def test_topic_page_lists_consumers_with_backlog_and_lag(stack, browser, shoot):  # noqa: F811
    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob:
        assert bob.command("SUB MESSAGE /ops/a").code == 200
    with Session(stack.smqp.host, stack.smqp.port, "alice") as alice:
        for i in range(4):
            smuid_of(alice.publish("/ops/a", f"waiting-{i}"))
    time.sleep(2)
    browser.get(stack.http + "/admin/ops/topic/?path=/ops/a")
    row = 'tr[data-account="bob"]'
    wait_until(lambda: cell(browser, f"#ops-consumers {row} [data-field=backlog]") is not None
               or browser.refresh(), what="bob in the consumers table")
    backlog = int(cell(browser, f"#ops-consumers {row} [data-field=backlog]"))
    assert backlog >= 4
    lag = float(cell(browser, f"#ops-consumers {row} [data-field=lag]").split()[0])
    assert lag >= 2
    assert "/ops/a" in cell(browser, f"#ops-consumers {row}")
    shoot("36-topic-consumers")
    with Session(stack.smqp.host, stack.smqp.port, "bob") as bob:  # drain for other tests
        for _ in range(backlog):
            bob.message()
            bob.ack()
