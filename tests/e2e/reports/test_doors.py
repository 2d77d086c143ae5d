"""Every door names itself in the usage events the reports count (issue 36, item 6): a
publish through REST, XMPP or SMQP is counted for that door, and so is the ACK an XMPP
subscriber's delivery makes, on each database."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.conftest import query_database
from tests.support.api_stack import api_stack
from tests.support.smqp_session import smuid_of
from tests.support.timing import wait_until
from tests.support.xmpp_session import SERVICE, XmppSession

pytestmark = pytest.mark.e2e

SETUP = """
from broker.services import topics as ts
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
from topics import tree
ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), '/doors')
for right in ('publish', 'subscribe'):
    UALEntry.objects.create(topic=ts.find('/doors'), principal_kind='everyone', right=right)
tree.changed()
"""
EVENTS = ("SELECT kind, account, smuid, detail FROM broker_usageevent "
          "WHERE kind IN ('publish', 'ack') ORDER BY id")


def events(env: dict[str, str]) -> list[list]:
    """The publish and ACK usage events, oldest first: [kind, account, smuid, detail]."""
    return [[kind, account, smuid, detail if isinstance(detail, dict) else json.loads(detail)]
            for kind, account, smuid, detail in query_database(env, EVENTS)]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    extra = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_PBKDF2_ITERATIONS": "4096"}
    with api_stack(request.param, tmp_path_factory.mktemp("doors"), SETUP,
                   extra_env=extra) as s:
        yield s


def test_publishes_and_acks_name_their_door(stack) -> None:
    xmpp = XmppSession(stack.http.replace("http://", "ws://", 1) + "/xmpp-websocket")
    jid = xmpp.login("alice")
    reply = xmpp.iq("set", "<pubsub xmlns='http://jabber.org/protocol/pubsub'>"
                           f"<subscribe node='/doors' jid='{jid.split('/')[0]}'/></pubsub>",
                    to=SERVICE)
    assert reply.get("type") == "result"
    with stack.client("bob") as rest:
        posted = rest.post("topics/doors/messages", json={"sections": [{"text": "r"}]})
        assert posted.status_code == 201, posted.text
        rest_smuid = posted.json()["smuid"]
    xmpp.event("item")  # alice's delivery: written to her stream, so ACKed (XMPP door)
    item = f"i{uuid.uuid4().hex[:6]}"
    reply = xmpp.iq("set", "<pubsub xmlns='http://jabber.org/protocol/pubsub'>"
                           f"<publish node='/doors'><item id='{item}'><p xmlns='urn:t'/></item>"
                           "</publish></pubsub>")
    assert reply.get("type") == "result"
    with stack.session("bob") as bob:
        smqp_smuid = smuid_of(bob.publish("/doors", "s"))
    xmpp.close()
    # XMPP ACKs reach the database in the dispatcher's next ACK batch.
    wait_until(lambda: any(r[0] == "ack" and r[2] == rest_smuid
                           for r in events(stack.smqp.env)), 30, interval=0.2,
               message="the REST message's ACK event")
    rows = events(stack.smqp.env)
    acks = [r for r in rows if r[0] == "ack" and r[2] == rest_smuid]
    doors = {(r[1], r[3].get("door")) for r in rows if r[0] == "publish"}
    assert doors == {("bob", "rest"), ("alice", "xmpp"), ("bob", "smqp")}, rows
    assert next(r for r in rows if r[0] == "publish" and r[2] == smqp_smuid)[3]["door"] \
        == "smqp"
    assert [(a[1], a[3].get("door")) for a in acks] == [("alice", "xmpp")], rows
