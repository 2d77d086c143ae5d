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

from tests.federation_net import Domain, federation, wait_for
from tests.smqp_session import Session, header, smuid_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def triangle(tmp_path_factory):
    with federation("sqlite", tmp_path_factory.mktemp("fed")) as domains:
        yield domains


def subscribe(d: Domain, pattern: str) -> Session:
    """bob on ``d``, subscribed to ``pattern`` (retried until the topic is there: a link
    makes its peer's topics here when it comes up)."""
    s = Session(d.host, d.port, "bob")
    wait_for(lambda: s.command(f"SUB MESSAGE {pattern}").code == 200, 120,
             f"SUB MESSAGE {pattern} on {d.name}", interval=0.5)
    return s


def state(d: Domain) -> dict:
    """Each link's row on ``d`` and its backlog (what ``d`` holds for that peer)."""
    out = d.shell(
        "import json\nfrom broker.models import Link\nfrom broker.services import federation\n"
        "print(json.dumps({l.name: {'state': l.state, 'stored': l.stored, 'dropped': "
        "l.dropped, 'last_error': l.last_error, 'subscribed': l.subscribed.split(), "
        "'backlog': federation.backlog(l)} for l in Link.objects.all()}))")
    return json.loads(out.strip().splitlines()[-1])


def wait_subscribed(d: Domain, link: str, pattern: str) -> None:
    """Until ``d``'s link ``link`` holds a subscription to ``pattern`` on its peer."""
    wait_for(lambda: pattern in state(d)[link]["subscribed"], 120,
             f"{d.name}'s link {link} subscribed to {pattern}", interval=0.5)


def stored_origins(d: Domain, prefix: str) -> list[tuple[str, str, str, str]]:
    """(topic, X-Origin, X-Route, Depth) of every message ``d`` stored below ``prefix``, in
    smuid order."""
    out = d.shell(
        "import json\nfrom broker.models import Message\nrows = []\n"
        f"for m in Message.objects.filter(topic__key__startswith={prefix.casefold()!r})"
        ".select_related('topic').order_by('pk'):\n"
        "    h = {k.lower(): v for k, v in m.headers}\n"
        "    rows.append([m.topic.path, h.get('x-origin'), h.get('x-route'), h.get('depth')])\n"
        "print(json.dumps(rows))")
    return [tuple(r) for r in json.loads(out.strip().splitlines()[-1])]


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
    on_b.close()
