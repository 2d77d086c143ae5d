"""SMQP's ``310 ACK`` has one answer wherever the client sends it: on the session's own
connection (the ACK command) or on its SET NOTIFY PORT connection
(:mod:`broker.consumers.smqp_notify_port`). Both go through
:meth:`~broker.consumers.smqp.SMQPConsumer.answer_ack`; here each outcome of the session's
ACK (recorded, nothing waiting, the queue lock lost, another refusal) is answered on both
and compared, with whether the next message may go. The port's connection is a stream
reader fed by hand and a writer that keeps what is written: no socket. The wire itself:
e2e/smqp/test_messages (SET NOTIFY PORT)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from broker.consumers.smqp import SMQPConsumer
from broker.consumers.smqp_notify_port import NotifyPort
from broker.domain.errors import Refusal
from broker.services import conflict, refuse
from broker.smqp import commands as c
from tests.support.timing import scaled

NOTHING_WAITS = b"400 Bad request (no message is waiting for 310 ACK)\r\n"
LOCK_LOST = conflict("lock not held")
OTHER = refuse(Refusal.of(510), "too many")

OUTCOMES = {  # what the session's ACK does → the answer, and whether the next one may go
    "recorded": (True, b"310 ACK\r\n", True),
    "nothing waits": (False, NOTHING_WAITS, False),
    "lock lost": (LOCK_LOST, f"409 {LOCK_LOST.text}\r\n".encode(), True),
    "other refusal": (OTHER, f"510 {OTHER.text}\r\n".encode(), False),
}


class Writer:
    """What NotifyPort uses of an asyncio.StreamWriter."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


@pytest.fixture
async def consumer():
    session = SMQPConsumer()
    session.scope = {"type": "smqp", "client": ["127.0.0.1", 4000]}
    session.written = []

    async def send(event: dict) -> None:
        session.written.append(event["bytes"])

    session.base_send = send
    await session.smqp_connect({"type": "smqp.connect"})
    session.written.clear()  # the greeting
    session.account = SimpleNamespace(pk=1)  # logged in, as far as ACK cares
    session.session = SimpleNamespace(guid="g1")
    session.pumped = 0
    yield session
    session._watchdog.cancel()


def acking(session: SMQPConsumer, outcome: object) -> None:
    """The session's ACK of the message in flight has ``outcome``; its pump is counted."""

    async def ack_inflight(smuid: int | None = None) -> bool:
        session.acked_smuids.append(smuid)
        if isinstance(outcome, Exception):
            raise outcome
        return bool(outcome)

    async def pump_here() -> None:
        session.pumped += 1

    session.acked_smuids = []
    session.delivery.ack_inflight = ack_inflight
    session.delivery.pump_here = pump_here


@pytest.mark.parametrize("name", sorted(OUTCOMES))
async def test_a_310_ack_is_answered_alike_on_the_session_and_on_its_notify_port(consumer,
                                                                                name):
    outcome, answer, next_goes = OUTCOMES[name]
    acking(consumer, outcome)
    await consumer._dispatch(c.Ack())
    await consumer.flush()
    assert b"".join(consumer.written) == answer
    assert consumer.pumped == (1 if next_goes else 0)

    reader, writer, kicked, gone = asyncio.StreamReader(), Writer(), [], []
    port = NotifyPort(reader, writer, answer_ack=consumer.answer_ack,
                      next_may_go=lambda: kicked.append(1), gone=gone.append,
                      closing=lambda: False)
    reader.feed_data(b"310 ack\r\n")  # read as the session reads it: any case
    reader.feed_eof()
    await asyncio.wait_for(port._task, scaled(5))
    assert writer.data == answer
    assert kicked == ([1] if next_goes else [])
    assert gone == [port] and writer.closed  # the client's end closed it: gone
    assert consumer.acked_smuids == [None, None]  # bare ACKs: the oldest in flight


async def test_an_ack_naming_its_message_is_passed_on_from_both_connections(consumer):
    """Profile §9.7: ``310 ACK <smuid>`` answers that message, on the session and on its
    notify port alike; a malformed one is refused there, as on the session."""
    acking(consumer, True)
    await consumer._dispatch(c.Ack(smuid=42))
    reader, writer = asyncio.StreamReader(), Writer()
    port = NotifyPort(reader, writer, answer_ack=consumer.answer_ack, next_may_go=lambda: None,
                      gone=lambda p: None, closing=lambda: False)
    reader.feed_data(b"310 ACK 43\r\n310 ACK x\r\n")
    reader.feed_eof()
    await asyncio.wait_for(port._task, scaled(5))
    assert consumer.acked_smuids == [42, 43]
    assert writer.data.startswith(b"310 ACK\r\n400 ")


async def test_the_notify_port_reads_nothing_but_310_ack(consumer):
    acking(consumer, True)
    reader, writer = asyncio.StreamReader(), Writer()
    port = NotifyPort(reader, writer, answer_ack=consumer.answer_ack, next_may_go=lambda: None,
                      gone=lambda p: None, closing=lambda: False)
    reader.feed_data(b"NOOP\r\n\r\n310 ACK\r\n")
    reader.feed_eof()
    await asyncio.wait_for(port._task, scaled(5))
    assert writer.data == (b"400 Bad request (only 310 ACK is read on this connection)\r\n"
                           b"310 ACK\r\n")
