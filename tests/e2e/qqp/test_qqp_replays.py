"""QQP replays racing their original through real sockets: the ResourceID is claimed in the
publish batch's transaction, so senders of one ResourceID at the same moment (on one
listener, where they may share a batch, and on two ``runqqp`` processes, whose batches meet
in the database) store one message, and every other sender hears 1 naming it."""

from __future__ import annotations

import re
import threading

import pytest

from broker.qqp.send import QQPSender
from tests.conftest import query_database, stop_listener
from tests.support.timing import scaled

from .test_qqp import item, qqp_broker, start_qqp

pytestmark = pytest.mark.e2e

ROUNDS = 10


def _race(ports: list[tuple[str, int]], rid: str) -> list[tuple[int, str]]:
    """Send the item ``rid`` on a connection to each of ``ports`` at once; the statuses."""
    senders = [QQPSender(host, port) for host, port in ports]  # greeted before the race
    start = threading.Barrier(len(senders))
    answers: list[tuple[int, str] | None] = [None] * len(senders)

    def send(i: int) -> None:
        start.wait()
        answers[i] = senders[i].send(item(rid, b"same payload"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(senders))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(scaled(60))
    finally:
        for sender in senders:
            sender.close()
    assert all(answer is not None for answer in answers), answers
    return answers  # type: ignore[return-value]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_senders_of_one_resource_id_at_once_store_it_once(tmp_path, backend):
    with qqp_broker(backend, tmp_path) as (smqp, qqp):
        other = start_qqp(smqp.env, tmp_path)  # a second listener: batches of its own
        try:
            # Two connections on one listener (one batch, when they arrive together) and
            # one on the other listener, for each ResourceID.
            ports = [(qqp.host, qqp.port), (qqp.host, qqp.port), (other.host, other.port)]
            outcomes = {f"race-{n}": _race(ports, f"race-{n}") for n in range(ROUNDS)}
            # A replay after all that: still 1.
            with QQPSender(other.host, other.port) as late:
                late_code, _ = late.send(item("race-0", b"same payload"))
        finally:
            stop_listener(other)
        messages, claims = _stored(smqp.env)
        assert sorted(rid for rid, _ in messages) == sorted(outcomes)  # each once
        smuids = dict(messages)
        assert claims == smuids  # every claim holds its message's smuid
        for rid, answers in outcomes.items():
            codes = sorted(code for code, _ in answers)
            assert codes == [1, 1, 2], (rid, answers)
            for code, text in answers:
                if code == 1:  # the message it names is the one stored
                    assert re.search(rf"stored before as {smuids[rid]}\b", text), (rid, text)
        assert late_code == 1
        assert qqp.alive()


def _stored(env: dict[str, str]) -> tuple[list[tuple[str, int]], dict[str, int | None]]:
    """(Cmuid, smuid) of every stored message, and the claims: ResourceID → smuid."""
    messages = query_database(env, "SELECT cmuid, id FROM broker_message ORDER BY id")
    claims = query_database(env, "SELECT resource_id, smuid FROM broker_qqpresource")
    return [tuple(row) for row in messages], dict(claims)
