"""What the usage reports need is written where things happen (issue 25), over real sockets:
a publish's event names its door and how many deliveries it made; MESSAGE SUBSCRIBE and
UNSUBSCRIBE write events (the unsubscribe with when the subscription was made); ACKs still
write theirs, joined to the publish by smuid."""

from __future__ import annotations

import json

import pytest

from tests.conftest import fresh_listener
from tests.support.smqp_session import Session, smuid_of

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from broker.services import topics as ts
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
from topics.models import Topic
from topics import tree
ts.create_topic(AccessSnapshot(Account.objects.get(username='root')), '/r')
bob = Account.objects.get(username='bob')
for right in ['subscribe', 'publish']:
    UALEntry.objects.create(topic=Topic.objects.get(path='/r'), principal_kind='account',
                            account=bob, right=right)
tree.changed()
"""
EVENTS = """
import json
from broker.models import UsageEvent
print(json.dumps([[e.kind, e.account, e.topic, e.smuid, e.detail]
                  for e in UsageEvent.objects.order_by('pk')
                  if e.kind in ('publish', 'ack', 'subscribe', 'unsubscribe')]))
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request, tmp_path_factory):
    with fresh_listener(request.param, tmp_path_factory.mktemp("events")) as b:
        b.manage("shell", "--no-imports", "-c", SETUP)
        yield b


def events(broker) -> list[list]:
    out = broker.manage("shell", "--no-imports", "-c", EVENTS).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_publish_subscribe_and_ack_events_carry_what_reports_need(broker) -> None:
    with Session(broker.host, broker.port, "bob") as bob:
        # At once: the login read the UAL and topic generations the setup's changes bumped
        # (SMQP _begin_session), so no poll interval needs to pass.
        assert bob.command("SUBSCRIBE MESSAGE /r").code == 200
        smuid = smuid_of(bob.publish("/r", "m1"))
        bob.message()
        bob.ack()
        assert bob.command("UNSUBSCRIBE MESSAGE /r").code == 200
    rows = events(broker)
    kinds = [r[0] for r in rows]
    assert kinds[:1] == ["subscribe"] and rows[0][1:3] == ["bob", "/r"]
    publish = next(r for r in rows if r[0] == "publish" and r[3] == smuid)
    assert publish[1:3] == ["bob", "/r"]
    assert publish[4] == {"door": "smqp", "to": 1}  # bob's subscription: one delivery
    ack = next(r for r in rows if r[0] == "ack" and r[3] == smuid)
    assert ack[1] == "bob"
    unsubscribe = next(r for r in rows if r[0] == "unsubscribe")
    assert unsubscribe[:3] == ["unsubscribe", "bob", "/r"] and "created" in unsubscribe[4]
