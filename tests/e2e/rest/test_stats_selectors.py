"""The REST door wired to the operators' figures and to selectors and leases, over real HTTP
(Daphne) with a real SMQP listener on the same database, SQLite and PostgreSQL:

* ``GET /api/v1/stats/`` against known traffic: its totals and rates match the REST and SMQP
  traffic sent, its depths and sessions match the store; staff only.
* REST publishes, pulls and ACKs are counted with the listeners' counters, so ``/metrics``
  (parsed by prometheus-client's own parser) includes them.
* Subscriptions with a selector (JMS and LDAP) and a lease: a pull receives exactly the
  matching messages of a mixed stream published over SMQP; a refused selector gets the
  same code and text as over SMQP (566 / 567 with its column); a lease ends and nothing
  reaches the account after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import run_manage
from tests.support.api_stack import ApiStack, api_stack
from tests.support.smqp_session import smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

T = TypeVar("T")
METRICS_TOKEN = "rest2-metrics-token"

SETUP = """
from broker.services import topics as ts
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
from topics.models import Topic
snap = AccessSnapshot(Account.objects.get(username='root'))
for p in ['/st', '/st/a', '/sel', '/sel/mix', '/sel/lease', '/sel/err', '/sel/two']:
    ts.create_topic(snap, p)
for name in ['bob', 'alice']:
    UALEntry.objects.create(topic=Topic.objects.get(path='/st'), principal_kind='account',
                            account=Account.objects.get(username=name), right='subscribe')
    UALEntry.objects.create(topic=Topic.objects.get(path='/sel'), principal_kind='account',
                            account=Account.objects.get(username=name), right='subscribe')
UALEntry.objects.create(topic=Topic.objects.get(path='/st'), principal_kind='account',
                        account=Account.objects.get(username='bob'), right='publish')
from topics import tree
tree.changed()
"""


def wait_until(probe: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    """``probe()`` until it gives something (a loaded machine: generous, no sleeps as
    asserts)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def store(stack: ApiStack, code: str) -> object:
    """``code`` (setting ``result``) run in ``manage.py shell`` on the stack's database."""
    out = run_manage(stack.env, "shell", "--no-imports", "-c",
                     code + "\nimport json\nprint('RESULT=' + json.dumps(result))").stdout
    line = [x for x in out.splitlines() if x.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):])


def publish(client: httpx.Client, topic: str, text: str) -> int:
    reply = client.post(f"topics/{topic}/messages", json={"sections": [{"text": text}]})
    assert reply.status_code == 201, reply.text
    return reply.json()["smuid"]


def pull(client: httpx.Client, sub: int, n: int = 50, wait: float = 0) -> list[dict]:
    reply = client.post(f"subscriptions/{sub}/pull", json={"max": n, "wait_seconds": wait})
    assert reply.status_code == 200, reply.text
    return reply.json()["messages"]


def pull_all(client: httpx.Client, sub: int, count: int, timeout: float = 60) -> list[dict]:
    """Pull until ``count`` messages came, then once more (waiting) to see that no more do."""
    got: list[dict] = []
    deadline = time.monotonic() + scaled(timeout)
    while len(got) < count and time.monotonic() < deadline:
        got += pull(client, sub, wait=2)
    got += pull(client, sub, wait=2)
    return got


# ------------------------------------------------------------------------ stats, counters


@pytest.fixture(params=["sqlite", "postgres"])
def counted_stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    """A stack of its own: the counters (under its own cache prefix) see only this test."""
    base = tmp_path_factory.mktemp(f"rest2-stats-{request.param}")
    with api_stack(request.param, base, SETUP,
                   extra_env={"SMQP_METRICS_TOKEN": METRICS_TOKEN}) as s:
        yield s


REST_PUBLISHED, SMQP_PUBLISHED, PULLED, ACKED = 5, 2, 3, 2


def metrics(stack: ApiStack) -> dict[str, float]:
    reply = httpx.get(stack.http + "/metrics", timeout=scaled(30),
                      headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert reply.status_code == 200, reply.text
    return {sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(reply.text)
            for sample in family.samples if sample.name == "smqp_messages_total"}


def test_stats_and_metrics_count_rest_and_smqp_traffic_and_match_the_store(counted_stack):
    stack = counted_stack
    with stack.client() as root, stack.client("alice") as alice, stack.session("bob") as bob:
        reply = alice.post("subscriptions/", json={"pattern": "/st/a"})
        assert reply.status_code == 201, reply.text
        sub = reply.json()["id"]
        for i in range(REST_PUBLISHED):
            publish(root, "st/a", f"rest-{i}")
        for i in range(SMQP_PUBLISHED):
            assert bob.publish("/st/a", f"smqp-{i}").code == 200
        got = []
        while len(got) < PULLED:
            got += pull(alice, sub, PULLED - len(got), wait=2)
        for message in got[:ACKED]:
            assert alice.post(f"receipts/{message['receipt']}/ack").status_code == 204
        # A replayed Idempotency-Key publishes nothing, and is not counted either.
        for _ in range(2):
            again = root.post("topics/st/a/messages", headers={"Idempotency-Key": "once"},
                              json={"sections": [{"text": "keyed"}]})
            assert again.status_code == 201, again.text
        published = REST_PUBLISHED + SMQP_PUBLISHED + 1
        expected = {"publish": published, "deliver": PULLED, "ack": ACKED}

        def settled() -> dict | None:
            reply = root.get("stats/")
            assert reply.status_code == 200, reply.text
            body = reply.json()
            return body if body["totals"] == expected else None

        stats = wait_until(settled, "stats totals of the REST and SMQP traffic")
        assert stats["counters_unavailable"] is None
        minutes = stats["rates"]["minutes"]
        assert len(minutes["publish"]) == 60 and minutes["step_seconds"] == 60
        # The traffic of this test is within the last hour and the last day.
        for kind, n in expected.items():
            assert sum(minutes[kind]) == n, kind
            assert sum(stats["rates"]["hours"][kind]) == n, kind
        assert "runsmqp" in {x["command"] for x in stats["listeners"]}
        # Group commits: the listener's of the SMQP publishes, Daphne's of the key-less REST
        # ones; the keyed REST publish committed with its key, in a transaction of its own.
        assert stats["group_commits"]["publish"]["size_sum"] == REST_PUBLISHED + SMQP_PUBLISHED

        figures = store(stack, """
from accounts.models import LoginSession
from broker.models import Delivery, Message
def n(**kw):
    return Delivery.objects.filter(message__topic__path='/st/a', **kw).count()
result = {
  "messages": Message.objects.filter(topic__path='/st/a', state='pending').count(),
  "pending": n(state='pending'), "locked": n(state='notified'), "dead": n(state='dead'),
  "acked": n(state='acked'),
  "sessions": LoginSession.objects.filter(ended__isnull=True).count(),
}""")
        assert figures == {"messages": published, "pending": published - PULLED,
                           "locked": PULLED - ACKED, "dead": 0, "acked": ACKED,
                           "sessions": 1}
        [row] = [r for r in stats["topics"] if r["path"] == "/st/a"]
        assert row == {"path": "/st/a", **{k: figures[k] for k in
                                           ("messages", "pending", "locked", "dead")}}
        assert stats["sessions"] == {"total": 1, "by_door": {"smqp": 1}}
        assert stats["dead_letters"] == []

        # /metrics (the console's scrape) holds the same counts, REST's included.
        assert metrics(stack) == {k: float(v) for k, v in expected.items()}

    # Staff only: a plain account gets 403 (SMQP's 401, no right), no token 401.
    with stack.client("bob") as bob_http:
        refused = bob_http.get("stats/")
        assert refused.status_code == 403
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["smqp_code"] == 401
    anonymous = httpx.get(stack.http + "/api/v1/stats/", timeout=scaled(30))
    assert anonymous.status_code == 401
    assert anonymous.json()["smqp_code"] == 530


# ------------------------------------------------------------------- selectors, leases


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    base = tmp_path_factory.mktemp(f"rest2-sel-{request.param}")
    with api_stack(request.param, base, SETUP) as s:
        yield s


def subscribe(client: httpx.Client, pattern: str, **extra: object) -> dict:
    reply = client.post("subscriptions/", json={"pattern": pattern, **extra})
    assert reply.status_code == 201, reply.text
    return reply.json()


KINDS = ("stock", "bond", "fund")


def test_selector_pulls_get_exactly_the_matching_messages_of_a_mixed_smqp_stream(stack):
    jms = {"class": "JMS", "text": "X_Kind = 'stock' AND X_Price >= 50"}
    ldap = {"class": "RFC-2254", "text": "(|(x-kind=bond)(&(x-kind=fund)(x-price<=20)))"}
    with stack.client("alice") as alice, stack.client("bob") as bob, \
            stack.session() as pub:
        a = subscribe(alice, "/sel/mix", selector=jms)
        b = subscribe(bob, "/sel/mix", selector=ldap)
        assert a["selector"] == jms and b["selector"] == ldap
        assert a["lease_end"] is None and a["topics"] == ["/sel/mix"]
        sent: dict[int, tuple[str, int]] = {}
        for i in range(60):
            kind, price = KINDS[i % 3], (i * 7) % 100
            reply = pub.publish("/sel/mix", f"m{i}", [("X-Kind", kind), ("X-Price", str(price))])
            sent[smuid_of(reply)] = (kind, price)
        want_a = {m for m, (k, p) in sent.items() if k == "stock" and p >= 50}
        want_b = {m for m, (k, p) in sent.items() if k == "bond" or (k == "fund" and p <= 20)}
        assert want_a and want_b and len(want_a | want_b) < len(sent)

        got_a = pull_all(alice, a["id"], len(want_a))
        got_b = pull_all(bob, b["id"], len(want_b))
        assert sorted(m["smuid"] for m in got_a) == sorted(want_a)
        assert sorted(m["smuid"] for m in got_b) == sorted(want_b)
        for m in got_a:
            assert m["headers"]["X-Kind"] == "stock" and int(m["headers"]["X-Price"]) >= 50
            assert alice.post(f"receipts/{m['receipt']}/ack").status_code == 204

        # A second selector on the same pattern is a subscription of its own; the list
        # shows both; DELETE of one leaves the other.
        second = subscribe(alice, "/sel/mix", selector={"class": "ldap", "text": "(x-kind=x)"})
        assert second["selector"] == {"class": "RFC-2254", "text": "(x-kind=x)"}
        listed = alice.get("subscriptions/").json()["results"]
        mine = {s["id"]: s for s in listed if s["pattern"] == "/sel/mix"}
        assert mine[a["id"]]["selector"] == jms and mine[second["id"]]["selector"]
        assert alice.delete(f"subscriptions/{second['id']}").status_code == 204
        listed = alice.get("subscriptions/").json()["results"]
        assert [s["id"] for s in listed if s["pattern"] == "/sel/mix"] == [a["id"]]
        for sub, client in ((a, alice), (b, bob)):
            assert client.delete(f"subscriptions/{sub['id']}").status_code == 204


def test_a_pull_of_a_selector_subscription_skips_what_another_one_of_the_account_took(stack):
    """Deliveries are the account's: with two subscriptions on one topic, one with a
    selector and one without, the selector's pull hands out only what it selects."""
    selector = {"class": "LDAP", "text": "(x-kind=stock)"}
    with stack.client("alice") as alice, stack.session() as pub:
        picky = subscribe(alice, "/sel/two", selector=selector)
        every = subscribe(alice, "/sel/two")
        kinds = {smuid_of(pub.publish("/sel/two", f"t{i}", [("X-Kind", KINDS[i % 2])])):
                 KINDS[i % 2] for i in range(8)}
        stocks = sorted(m for m, k in kinds.items() if k == "stock")
        got = pull_all(alice, picky["id"], len(stocks))
        assert sorted(m["smuid"] for m in got) == stocks
        rest = pull_all(alice, every["id"], len(kinds) - len(stocks))
        assert sorted(m["smuid"] for m in rest) == sorted(set(kinds) - set(stocks))
        for m in got + rest:
            assert alice.post(f"receipts/{m['receipt']}/ack").status_code == 204
        for sub in (picky, every):
            assert alice.delete(f"subscriptions/{sub['id']}").status_code == 204


@pytest.mark.parametrize(("selector", "line"), [
    ({"class": "XPATH", "text": "/a"}, "SELECTOR XPATH /a"),
    ({"class": "JMS", "text": "X_A = "}, "SELECTOR JMS X_A = "),
    ({"class": "JMS", "text": "X_A < 'x'"}, "SELECTOR JMS X_A < 'x'"),
    ({"class": "LDAP", "text": "(x-a=1"}, "SELECTOR LDAP (x-a=1"),
])
def test_a_refused_selector_gets_what_smqp_gives(stack, selector, line):
    with stack.client("bob") as bob, stack.session("bob") as smqp:
        wire = smqp.command(f"SUB MESSAGE /sel/err {line}")
        reply = bob.post("subscriptions/", json={"pattern": "/sel/err", "selector": selector})
    assert wire.code in (566, 567)
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/problem+json"
    body = reply.json()
    assert body["smqp_code"] == wire.code
    assert body["detail"] == " ".join(wire.lines)
    if wire.code == 567:
        assert f"at column {body['column']})" in body["detail"]
    else:
        assert "column" not in body
    with stack.client("bob") as bob:
        assert all(s["pattern"] != "/sel/err" for s in bob.get("subscriptions/").json()["results"])


@pytest.mark.parametrize("extra", [
    {"selector": {"class": "JMS", "text": "A = 'x\u0000'"}},
    {"selector": {"class": "JMS", "text": "A = 1\r\nB = 2"}},
    {"selector": {"class": "JMS"}},
    {"selector": "JMS A = 1"},
    {"lease_seconds": 0},
    {"lease_seconds": 2**31},
    {"resource": "TOPIC", "lease_seconds": 5},
    {"resource": "TOPIC", "selector": {"class": "JMS", "text": "TRUE"}},
])
def test_bad_selector_or_lease_input_is_a_400_and_stores_nothing(stack, extra):
    with stack.client("bob") as bob:
        reply = bob.post("subscriptions/", json={"pattern": "/sel/err", **extra})
        assert reply.status_code == 400, reply.text
        assert reply.json()["smqp_code"] == 400
        assert all(s["pattern"] != "/sel/err" for s in bob.get("subscriptions/").json()["results"])


def test_a_lease_ends_and_nothing_reaches_the_account_after_it(stack):
    selector = {"class": "JMS", "text": "X_Kind = 'stock'"}
    with stack.client("alice") as alice, stack.session() as pub:
        sub = subscribe(alice, "/sel/lease", selector=selector, lease_seconds=3)
        assert sub["lease_end"] is not None and sub["lease_end"] > sub["created"]
        before = smuid_of(pub.publish("/sel/lease", "before", [("X-Kind", "stock")]))
        smuid_of(pub.publish("/sel/lease", "unselected", [("X-Kind", "bond")]))
        [got] = pull_all(alice, sub["id"], 1)
        assert got["smuid"] == before
        assert alice.post(f"receipts/{got['receipt']}/ack").status_code == 204

        # The listener's sweep ends the subscription once its lease is over.
        def ended() -> bool | None:
            items = alice.get("subscriptions/").json()["results"]
            return True if all(s["id"] != sub["id"] for s in items) else None

        wait_until(ended, "the lease to end the subscription")
        after = smuid_of(pub.publish("/sel/lease", "after", [("X-Kind", "stock")]))
        gone = alice.post(f"subscriptions/{sub['id']}/pull", json={"max": 10})
        assert gone.status_code == 404
        assert gone.json()["smqp_code"] == 404
        # Nothing was kept for alice either: no delivery of the later message.
        assert store(stack, f"""
from broker.models import Delivery
result = Delivery.objects.filter(message_id={after}, account__username='alice').count()
""") == 0
        # Subscribing again starts a new lease, and the later message is in its backlog.
        again = subscribe(alice, "/sel/lease", selector=selector, lease_seconds=60)
        assert [m["smuid"] for m in pull_all(alice, again["id"], 1)] == [after]
