"""Issue 34, item 9: every live session of an account gets live fan-out messages (SMQP
profile §8), whatever the timing: two resources of one account online, items published
back to back to a fan-out node, each resource gets every one of them, in order."""

from __future__ import annotations

import time

import pytest

from tests.support.timing import SLOWDOWN, scaled
from tests.support.xmpp_session import PUBSUB, XmppSession

from .test_xmpp import create, node, ok, session, subscribe, xmpp  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

ROUNDS = 5
ITEMS = 5


def _publish_back_to_back(pub: XmppSession, path: str, ids: list[str]) -> None:
    sent = [pub.send_iq("set", f"<pubsub xmlns='{PUBSUB}'><publish node='{path}'><item "
                        f"id='{i}'><n xmlns='urn:f'/></item></publish></pubsub>") for i in ids]
    for iq_id in sent:
        ok(pub.reply(iq_id))


def test_every_live_session_of_an_account_gets_every_live_item(xmpp):  # noqa: F811
    _, url = xmpp
    pub = session(url, "alice")
    path = node()
    create(pub, path)
    r1, r2 = session(url, "jtegen", resource="r1"), session(url, "jtegen", resource="r2")
    ok(subscribe(r1, path))
    for n in range(ROUNDS):
        ids = [f"n{n}i{i}" for i in range(ITEMS)]
        _publish_back_to_back(pub, path, ids)
        for s in (r1, r2):
            got = []
            deadline = time.monotonic() + scaled(20)  # a wait budget, not a bound
            while len(got) < len(ids) and (left := deadline - time.monotonic()) > 0:
                try:
                    got.append(s.event("item", node=path, timeout=left / SLOWDOWN)[1].get("id"))
                except AssertionError:  # none within the time left
                    break
            assert got == ids, (s.jid, got)
    for s in (pub, r1, r2):
        s.close()


BACKLOG = 300


def test_a_backlog_read_on_a_new_stream_sends_no_item_twice(xmpp):  # noqa: F811
    """Issue 37: a subscriber comes back to a backlog and subscribes at once after binding
    (as the cluster test's clients do): the bind's page is being written while the
    subscribe's stanza reads the backlog again, the written items' ACKs waiting for that
    stanza's flush. Every item comes once. An item published after them all comes after
    any item queued again (the mailbox sends in smuid order), so it ends the wait."""
    _, url = xmpp
    pub = session(url, "alice")
    path = node()
    create(pub, path)
    sub = session(url, "jtegen", resource="before")
    ok(subscribe(sub, path))
    sub.close()
    ids = [f"b{i}" for i in range(BACKLOG)]
    _publish_back_to_back(pub, path, ids)
    sub = session(url, "jtegen", resource="after")
    subscribed = subscribe_iq(sub, path)
    ok(sub.reply(subscribed))
    seen = [i.get("id") for _, i in (sub.event("item", node=path) for _ in ids)]
    _publish_back_to_back(pub, path, ["last"])
    while seen[-1] != "last":
        seen.append(sub.event("item", node=path)[1].get("id"))
    assert sorted(seen[:-1]) == sorted(ids), [i for i in seen if seen.count(i) > 1][:20]
    for s in (pub, sub):
        s.close()


def subscribe_iq(s: XmppSession, path: str) -> str:
    """Send a subscribe without waiting for its answer: its IQ id."""
    return s.send_iq("set", f"<pubsub xmlns='{PUBSUB}'><subscribe node='{path}' "
                            f"jid='{s.jid.split('/')[0]}'/></pubsub>")
