"""Federation (profile §9.5) end to end: three real brokers, each a listener and a link
supervisor on a database of its own (contexts a.test, b.test, c.test), linked in a triangle
(tests/federation_net.py). Subscribers and publishers are plain SMQP sessions over TCP.

Absence is never judged by waiting: a message that must not arrive is followed, on the same
topic and link, by one that must (a marker); links deliver in order, so once the marker is
there the other would have been too. Where copies travel by several routes, the test waits
until every server holds nothing more for any peer (the links' backlogs are empty and their
counters settled) and then counts what each server stored.
"""

from __future__ import annotations

import json

import pytest

from tests.support.federation_net import Domain, federation, wait_for
from tests.support.smqp_session import Session, header, smuid_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def triangle(request, tmp_path_factory):
    with federation(request.param, tmp_path_factory.mktemp(f"fed-{request.param}")) as domains:
        yield domains


def subscribe(d: Domain, *patterns: str) -> Session:
    """bob on ``d``, subscribed to ``patterns`` (retried: on a loaded machine the link's
    topics may still be on their way)."""
    s = Session(d.host, d.port, "bob")
    for pattern in patterns:
        wait_for(lambda p=pattern: s.command(f"SUB MESSAGE {p}").code == 200, 120,
                 f"SUB MESSAGE {pattern} on {d.name}", interval=0.5)
    return s


def state(d: Domain) -> dict:
    """Each link's row on ``d`` and its backlog: what ``d`` holds for that peer (pending
    deliveries to the peer's account here, as the admin counts them)."""
    out = {}
    for name, st, stored, dropped, error, subscribed, peer in d.sql(
            "SELECT name, state, stored, dropped, last_error, subscribed, peer_account_id "
            "FROM broker_link"):
        [(backlog,)] = d.sql(
            "SELECT count(*) FROM broker_delivery d JOIN broker_message m ON m.id = "
            "d.message_id WHERE d.account_id = ? AND d.state IN ('pending', 'notified') "
            "AND m.state = 'pending'", (peer,))
        out[name] = {"state": st, "stored": stored, "dropped": dropped, "last_error": error,
                     "subscribed": subscribed.split(), "backlog": backlog}
    return out


def wait_subscribed(d: Domain, link: str, pattern: str) -> None:
    """Until ``d``'s link ``link`` holds a subscription to ``pattern`` on its peer."""
    wait_for(lambda: pattern in state(d)[link]["subscribed"], 120,
             f"{d.name}'s link {link} subscribed to {pattern}", interval=0.5)


def stored_origins(d: Domain, prefix: str) -> list[tuple[str, str, str, str]]:
    """(topic, X-Origin, X-Route, Depth) of every message ``d`` stored below ``prefix``, in
    smuid order."""
    rows = []
    for path, headers in d.sql(
            "SELECT t.path, m.headers FROM broker_message m JOIN topics_topic t ON t.id = "
            "m.topic_id WHERE t.key LIKE ? ORDER BY m.id", (prefix.casefold() + "%",)):
        pairs = json.loads(headers) if isinstance(headers, str) else headers  # PostgreSQL: jsonb
        h = {k.lower(): v for k, v in pairs}
        rows.append((path, h.get("x-origin"), h.get("x-route"), h.get("depth")))
    return rows


def publish(d: Domain, topic: str, depth: int, n: int = 1, tag: str = "m") -> list[int]:
    with Session(d.host, d.port, "bob") as s:
        return [smuid_of(s.publish(topic, f"{tag}{i}", [("Depth", str(depth))]))
                for i in range(n)]


def receive(s: Session, count: int) -> list:
    got = []
    for _ in range(count):
        msg = s.message(timeout=120)
        got.append(msg)
        s.ack()
    return got


def test_depth_one_reaches_b_once_and_not_c(triangle):
    a, b, c = triangle["a"], triangle["b"], triangle["c"]
    on_b = subscribe(b, "/a/news/d1")
    on_c = subscribe(c, "/b/a/news/d1")  # only by way of B
    wait_subscribed(c, "b", "/a/news/d1")
    wait_subscribed(b, "a", "/news/d1")
    [first] = publish(a, "/news/d1", 1, tag="one")
    [marker] = publish(a, "/news/d1", -1, tag="marker")
    got = receive(on_b, 2)
    assert [header(m, "X-Origin") for m in got] == [f"a.test/{first}", f"a.test/{marker}"]
    assert [m.topic for m in got] == ["/a/news/d1", "/a/news/d1"]
    assert header(got[0], "Depth") == "0" and header(got[1], "Depth") == "-1"
    assert header(got[0], "X-Route") == "a.test,b.test"
    # C: the Depth 1 message stopped at B; the marker behind it came on.
    [only] = receive(on_c, 1)
    assert header(only, "X-Origin") == f"a.test/{marker}"
    assert header(only, "X-Route") == "a.test,b.test,c.test"
    assert only.topic == "/b/a/news/d1"
    assert on_b.quiet(0.5) and on_c.quiet(0.5)
    on_b.close()
    on_c.close()


def test_depth_zero_stays_on_a(triangle):
    a, b = triangle["a"], triangle["b"]
    on_b = subscribe(b, "/a/news/d0")
    wait_subscribed(b, "a", "/news/d0")
    [local] = publish(a, "/news/d0", 0, tag="local")
    [nodepth] = [smuid_of(Session(a.host, a.port, "bob").publish("/news/d0", "plain"))]
    [marker] = publish(a, "/news/d0", 1, tag="marker")
    [msg] = receive(on_b, 1)
    assert header(msg, "X-Origin") == f"a.test/{marker}"
    assert local < nodepth < marker
    # Interest withdrawn: B's subscriber unsubscribes, B's link unsubscribes on A, and A
    # keeps nothing more for B there.
    assert on_b.command("UNSUB MESSAGE /a/news/d0").code == 200
    held_for_b = ("SELECT count(*) FROM broker_subscription s JOIN accounts_account a ON "
                  "a.id = s.account_id WHERE a.username = 'peer_b' AND s.pattern = '/news/d0'")
    wait_for(lambda: a.sql(held_for_b) == [(0,)], 120, "B's link to unsubscribe on A")
    [later] = publish(a, "/news/d0", 1, tag="later")
    assert a.sql("SELECT count(*) FROM broker_delivery d JOIN accounts_account a ON a.id = "
                 "d.account_id WHERE d.message_id = ? AND a.username = 'peer_b'",
                 (later,)) == [(0,)]
    on_b.close()


def settled(domains: dict[str, Domain]) -> dict[str, dict]:
    """Each domain's link states once no server holds anything for any peer (every copy that
    travels has been stored or dropped) and the link counters have stopped moving."""
    last: list[dict] = []

    def quiet() -> dict | None:
        now = {name: state(d) for name, d in domains.items()}
        empty = all(link["backlog"] == 0 for s in now.values() for link in s.values())
        same = bool(last) and last[-1] == now
        last.append(now)
        return now if empty and same else None

    try:
        return wait_for(quiet, 180, "the federation to settle", interval=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[-1] if last else None}") from None


def test_depth_unlimited_reaches_each_once_without_loops(triangle):
    """Depth -1 over every route of the triangle: B and C each store every message once
    (the second copy, by the other route, is a duplicate), and A drops its own messages
    coming back (its context is on their route)."""
    a, b, c = triangle["a"], triangle["b"], triangle["c"]
    subs = [(b, ["/a/news/dm", "/c/a/news/dm"]), (c, ["/a/news/dm", "/b/a/news/dm"]),
            (a, ["/b/a/news/dm", "/c/a/news/dm"])]
    # One session per server: every session of an account gets its messages.
    sessions = {d.name: subscribe(d, *patterns) for d, patterns in subs}
    for d, link, pattern in [(b, "a", "/news/dm"), (b, "c", "/a/news/dm"),
                             (c, "a", "/news/dm"), (c, "b", "/a/news/dm"),
                             (a, "b", "/a/news/dm"), (a, "c", "/a/news/dm")]:
        wait_subscribed(d, link, pattern)
    before = {name: state(d) for name, d in triangle.items()}
    smuids = publish(a, "/news/dm", -1, n=5, tag="mesh")
    origins = [f"a.test/{n}" for n in smuids]
    after = settled(triangle)
    for d in (b, c):
        rows = stored_origins(d, "/")
        mine = [r for r in rows if r[1] in origins]
        assert sorted(r[1] for r in mine) == sorted(origins), (d.name, mine)
        for _topic, _, route, depth in mine:
            assert depth == "-1"
            assert route.endswith(f",{d.context}") and route.startswith("a.test,")
    assert [r for r in stored_origins(a, "/") if r[1] in origins] == []

    def dropped(name: str) -> int:
        return sum(after[name][link]["dropped"] - before[name][link]["dropped"]
                   for link in after[name])

    # Every message came back to A at least once (from B or C, whichever stored it from A
    # directly) and reached B or C a second time: at least one loop and one duplicate each.
    assert dropped("a") >= 5
    assert dropped("b") + dropped("c") >= 5
    # B's and C's subscriber got each message once, by whichever route it was stored.
    for d in (b, c):
        s, got = sessions[d.name], []
        while not set(origins) <= set(got):
            got.append(header(s.message(timeout=120), "X-Origin"))
            s.ack()
        assert s.quiet(0.5)  # nothing more: each is stored there once (above)
        assert sorted(o for o in got if o in origins) == sorted(origins), (d.name, got)
    assert sessions["a"].quiet(0.5)
    for s in sessions.values():
        s.close()


def test_peer_without_remote_right_gets_nothing(triangle):
    """On A, B's account may subscribe to /secret (the subscribe right) but has no
    ``remote`` right there: B's link subscribes, and yet A gives it nothing, neither what
    is published afterwards nor what was held there before."""
    a, b = triangle["a"], triangle["b"]
    a.shell("from accounts.models import Account\nfrom topics.models import Topic\n"
            "from ual import grants\n"
            "grants.grant_to_many(Topic.objects.get(key='/secret'), 'subscribe', 'allow', "
            "[Account.objects.get(username='peer_b')])")
    [before] = publish(a, "/secret", -1, tag="before")
    on_b = subscribe(b, "/a/secret")
    wait_subscribed(b, "a", "/secret")
    [after] = publish(a, "/secret", -1, tag="after")
    assert a.sql("SELECT count(*) FROM broker_delivery d JOIN accounts_account a ON a.id = "
                 "d.account_id WHERE d.message_id IN (?, ?) AND a.username = 'peer_b'",
                 (before, after)) == [(0,)]
    # The same link does receive where A gives B's account the remote right (/news).
    on_b.command("SUB MESSAGE /a/news/d1")
    wait_subscribed(b, "a", "/news/d1")
    [marker] = publish(a, "/news/d1", 1, tag="remote")
    assert header(on_b.message(timeout=120), "X-Origin") == f"a.test/{marker}"
    on_b.ack()
    assert stored_origins(b, "/a/secret") == []
    on_b.close()
