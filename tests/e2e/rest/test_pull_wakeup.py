"""Issue 38 item 3 over real HTTP (SQLite and PostgreSQL): a long-polling REST pull waits
on the dispatcher's wake-up, not a sleep loop. Daphne here looks at the store only once an
hour while a pull waits (SMQP_API_PULL_POLL_SECONDS), so a pull that returns a message
published during its wait, before its wait_seconds end, was woken by that commit: one made
by a REST publish in Daphne's own process, and one made by the SMQP listener (the wake-up
crosses processes through Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.rest.test_api import publish, pull, subscribe
from tests.support.api_stack import ApiStack, api_stack
from tests.support.smqp_session import smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

WAIT = 20  # wait_seconds of the pulls (SMQP_API_PULL_MAX_WAIT's default)

SETUP = """
from broker.services import topics as ts
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for p in ['/w', '/w/rest', '/w/smqp']:
    ts.create_topic(snap, p)
UALEntry.objects.create(topic=Topic.objects.get(path='/w'), principal_kind='account',
                        account=Account.objects.get(username='bob'), right='subscribe')
from topics import tree
tree.changed()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    base = tmp_path_factory.mktemp(f"pullwake-{request.param}")
    with api_stack(request.param, base, SETUP,
                   extra_env={"SMQP_API_PULL_POLL_SECONDS": "3600",
                              "SMQP_API_PULL_MAX_WAIT": str(WAIT)}) as s:
        yield s


def timed_pull(client, sub: int) -> tuple[list[dict], float]:
    began = time.monotonic()
    got = pull(client, sub, 1, WAIT)
    return got, time.monotonic() - began


def test_a_waiting_pull_is_woken_by_a_rest_publish(stack):
    with stack.client("bob") as bob, stack.client() as root, ThreadPoolExecutor(1) as pool:
        sub = subscribe(bob, "/w/rest")
        assert pull(bob, sub) == []  # nothing yet
        waiting = pool.submit(timed_pull, bob, sub)
        # (Not an assertion: lets the pull start waiting first. Nothing tells a client that
        # a pull is waiting; scaled, so that a loaded machine still tests the wake-up.)
        time.sleep(scaled(1))
        assert not waiting.done()  # a pull with nothing to give waits
        smuid = publish(root, "w/rest", "wake up")
        got, took = waiting.result(timeout=scaled(WAIT * 3))
        assert [m["smuid"] for m in got] == [smuid]
        # The look an hour later never came: the commit's wake-up ended the wait.
        assert took < WAIT, took


def test_a_waiting_pull_is_woken_by_an_smqp_publish_in_another_process(stack):
    with stack.client("bob") as bob, stack.session() as root, ThreadPoolExecutor(1) as pool:
        sub = subscribe(bob, "/w/smqp")
        waiting = pool.submit(timed_pull, bob, sub)
        time.sleep(scaled(1))  # (not an assertion: as above)
        assert not waiting.done()
        reply = root.publish("/w/smqp", "over-smqp")
        assert reply.code == 200
        got, took = waiting.result(timeout=scaled(WAIT * 3))
        assert [m["smuid"] for m in got] == [smuid_of(reply)]
        assert took < WAIT, took
