"""Issue 34 at the XMPP door (a real Daphne WebSocket beside a real listener, SQLite and
PostgreSQL): replacing an item needs what retracting it needs (item 4), a hidden node answers
``<create/>`` as a missing one (7), XEP-0254 §2.4's own unlock form (8), and every oversize
frame and every processing instruction end the stream with their stream errors (10)."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from tests.conftest import BrokerProcess
from tests.e2e.xmpp.test_xmpp import create, ok, publish, session, subscribe
from tests.support.xmpp_session import (
    CLIENT,
    PUBSUB,
    QUEUEING,
    STANZAS,
    error_condition,
    stream_error_condition,
    tag,
    xmpp_stack,
)

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from broker.services import topics as ts
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for path in ('/x', '/secret', '/secret/inner'):
    ts.create_topic(snap, path)
x = ts.find('/x')
UALEntry.objects.create(topic=x, principal_kind='account',
                        account=Account.objects.get(username='alice'), right='manage')
for right in ('publish', 'subscribe'):
    UALEntry.objects.create(topic=x, principal_kind='everyone', right=right)
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def xmpp(request, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-hard")
    with xmpp_stack(request.param, base, SETUP) as stack:
        yield stack


def node() -> str:
    return f"/x/h{uuid.uuid4().hex[:8]}"


def items_of(s, path: str) -> dict[str, str]:
    found = ok(s.pubsub("get", f"<items node='{path}'/>")).findall(f".//{tag(PUBSUB, 'item')}")
    return {i.get("id"): next(iter(i)).text for i in found}


def error_text(reply: ET.Element) -> tuple[str | None, str | None]:
    text = reply.find(f"{tag(CLIENT, 'error')}/{tag(STANZAS, 'text')}")
    return error_condition(reply), text.text if text is not None else None


# ------------------------------------------------------------------ item 4


def test_a_co_publisher_cannot_replace_anothers_item(xmpp):
    _, url = xmpp
    alice, bob = session(url, "alice"), session(url, "bob")
    path = node()
    create(alice, path)
    publish(alice, path, "<o xmlns='urn:o'>alice's</o>", "order-1")
    # bob may not retract it, so he may not replace it either
    reply = bob.pubsub("set", f"<retract node='{path}'><item id='order-1'/></retract>")
    assert error_condition(reply) == "forbidden"
    reply = bob.pubsub("set", f"<publish node='{path}'><item id='order-1'>"
                              "<o xmlns='urn:o'>bob's</o></item></publish>")
    assert error_condition(reply) == "forbidden"
    assert items_of(alice, path) == {"order-1": "alice's"}
    # its publisher replaces it; the manage right replaces anyone's
    publish(alice, path, "<o xmlns='urn:o'>alice's v2</o>", "order-1")
    assert items_of(alice, path) == {"order-1": "alice's v2"}
    publish(bob, path, "<o xmlns='urn:o'>bob's</o>", "order-2")
    publish(alice, path, "<o xmlns='urn:o'>alice over bob</o>", "order-2")
    assert items_of(bob, path) == {"order-1": "alice's v2", "order-2": "alice over bob"}
    for s in (alice, bob):
        s.close()


# ------------------------------------------------------------------ item 7


@pytest.mark.parametrize("hidden, missing", [
    ("/secret", "/nothere"), ("/secret/kid", "/nothere/kid"),
    ("/secret/inner/kid", "/nothere/inner/kid")])
def test_create_on_a_hidden_node_answers_as_on_a_missing_one(xmpp, hidden, missing):
    _, url = xmpp
    bob = session(url, "bob")
    answers = [error_text(bob.pubsub("set", f"<create node='{p}'/>")) for p in (hidden, missing)]
    assert answers[0] == answers[1] and answers[0][0] is not None
    bob.close()


# ------------------------------------------------------------------ item 8


def test_the_xeps_own_unlock_form(xmpp):
    """XEP-0254 §2.4: ``<pubsub><unlock xmlns='urn:xmpp:pubsub:queueing:0' node=…><item/>
    </unlock></pubsub>``, as an IQ get as the XEP sends it, and as a set."""
    _, url = xmpp
    pub, worker = session(url, "alice"), session(url, "bob")
    path = node()
    create(pub, path, queue=True, retry=300)
    ok(subscribe(worker, path, 1))
    publish(pub, path, "<job xmlns='urn:q'>1</job>", "j1")
    assert worker.event("item", node=path)[1].get("id") == "j1"
    for kind in ("get", "set"):
        ok(worker.pubsub(kind, f"<unlock xmlns='{QUEUEING}' node='{path}'>"
                               "<item id='j1'/></unlock>"))
        assert worker.event("unlock", node=path)[1].get("id") == "j1"
        assert worker.event("item", node=path)[1].get("id") == "j1"  # back to the one worker
    reply = worker.pubsub("set", f"<unlock xmlns='{QUEUEING}' node='{path}'>"
                                 "<item id='nope'/></unlock>")
    assert error_condition(reply) == "item-not-found"
    for s in (pub, worker):
        s.close()


# ------------------------------------------------------------------ item 10


@pytest.mark.parametrize("size", [300 * 1024, 2 * 1024 * 1024])
def test_every_oversize_frame_gets_policy_violation_and_a_close(xmpp, size):
    """Above SMQP_XMPP_MAX_FRAME (256 KiB) and above Daphne's own 1 MiB limit alike."""
    _, url = xmpp
    bob = session(url, "bob")
    path = node()
    body = "x" * size
    bob.send(f"<iq xmlns='{CLIENT}' type='set' id='big' to='pubsub.localhost'>"
             f"<pubsub xmlns='{PUBSUB}'><publish node='{path}'><item><b xmlns='urn:b'>{body}"
             "</b></item></publish></pubsub></iq>")
    assert stream_error_condition(bob) == "policy-violation"
    assert bob.closed()


@pytest.mark.parametrize("frame", [
    f"<?proc x?><iq xmlns='{CLIENT}' type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>",
    f"<iq xmlns='{CLIENT}' type='get' id='p2'><ping xmlns='urn:xmpp:ping'/></iq><?proc x?>",
    f"<iq xmlns='{CLIENT}' type='get' id='p3'><?proc x?><ping xmlns='urn:xmpp:ping'/></iq>",
])
def test_a_processing_instruction_anywhere_is_restricted_xml(xmpp, frame):
    _, url = xmpp
    bob = session(url, "bob")
    bob.send(frame)
    assert stream_error_condition(bob) == "restricted-xml"
    assert bob.closed()

