"""A link's ``310 ACK <n>`` refused by its peer (profile §9.7: ``409`` when the connection
holds no such message any more) ends nothing: the link counts it, logs it and goes on in the
same session. Only a broken protocol (connection lost, 5xx, a reply nobody expects) restarts
it; a restart would send the whole window again.

The trigger is real: A's topic gives up on a message after one retry timeout (max retries 0),
and B's link supervisor is stopped (SIGSTOP) until A has recorded the message dead. B then
finds it in its socket, stores it and ACKs it, late: A answers 409.
"""

from __future__ import annotations

import signal

import pytest

from tests.e2e.federation.test_triangle import (
    publish,
    state,
    stored_origins,
    subscribe,
    wait_subscribed,
)
from tests.support.federation_net import federation, wait_for
from tests.support.smqp_session import header

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_late_ack_refused_by_the_peer_keeps_the_link_session(backend, tmp_path):
    with federation(backend, tmp_path, names=("a", "b")) as domains:
        a, b = domains["a"], domains["b"]
        # On A, /news/d0 gives a message up at its first retry deadline.
        a.shell(
            "from topics.models import Topic\n"
            "Topic.objects.filter(key='/news/d0').update(retry_timeout=1, max_retries=0)"
        )
        bob = subscribe(b, "/a/news/d0", "/a/news/d1")
        wait_subscribed(b, "a", "/news/d0")
        wait_subscribed(b, "a", "/news/d1")
        assert b.links_log is not None and b.links is not None
        wait_for(
            lambda: "link a: window" in b.links_log.read_text(), 60, "B's link to have its window"
        )
        assert b.links_log.read_text().count("link a up") == 1

        b.links.send_signal(signal.SIGSTOP)
        try:
            [late] = publish(a, "/news/d0", -1, tag="late")
            dead = (
                "SELECT count(*) FROM broker_delivery d JOIN accounts_account a ON a.id = "
                "d.account_id WHERE d.message_id = ? AND a.username = 'peer_b' "
                "AND d.state = 'dead'"
            )
            wait_for(
                lambda: a.sql(dead, (late,)) == [(1,)], 120, "A to give up on the message for B"
            )
        finally:
            b.links.send_signal(signal.SIGCONT)

        # B stores what it had been sent (once) and ACKs it, late: A answers 409. A marker
        # behind it, on a topic with the usual retries: once A has its ACK, A has answered
        # the late one before (in order, on the same connection).
        [marker] = publish(a, "/news/d1", -1, tag="marker")
        acked = (
            "SELECT count(*) FROM broker_delivery d JOIN accounts_account a ON a.id = "
            "d.account_id WHERE d.message_id = ? AND a.username = 'peer_b' "
            "AND d.state = 'acked'"
        )
        wait_for(lambda: a.sql(acked, (marker,)) == [(1,)], 120, "A to have B's ACK")
        # A second marker leaves A after its 409: on the same session when B's link read
        # that answer and went on, on a new one when the answer ended the session.
        [second] = publish(a, "/news/d1", -1, tag="second")
        got = []
        while f"a.test/{second}" not in got:
            got.append(header(bob.message(timeout=120), "X-Origin"))
            bob.ack()
        assert got == [f"a.test/{late}", f"a.test/{marker}", f"a.test/{second}"]
        assert [r[1] for r in stored_origins(b, "/a/news/d0")] == [f"a.test/{late}"]
        log = b.links_log.read_text()
        assert log.count("link a up") == 1, log
        assert "again in" not in log, log
        assert f"link a: 310 ACK {late} refused by the peer: 409" in log, log
        assert state(b)["a"]["state"] == "up"
        bob.close()
