"""A session's delivery state (the SMQP consumer's offer / NOTIFY / 310 ACK cycle) against a
dispatcher that stands in for the store, so that the moments between a message leaving the
waiting queue and its NOTIFY can be held open. The same rules over real sockets are in
e2e/smqp/test_messages and e2e/smqp/test_backlog."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from broker.consumers.smqp import SMQPConsumer
from broker.services.ack import AckRequest
from broker.services.read import DeliveryPolicy
from broker.smqp import commands as c
from broker.smqp.message import DataSection, Message
from tests.support.timing import scaled

ACCOUNT = 42
TOPIC = "/t"


def payload(smuid: int) -> tuple[str, str, Message]:
    message = Message([("Created", "D11242026T04000000Z")],
                      [DataSection([("Content-Type", "text/plain"),
                                    ("Content-Length", str(len(f"m{smuid}")))],
                                   f"m{smuid}".encode())])
    return TOPIC, f"pub/g/{smuid}", message


class GatedDispatcher:
    """load / deliverable / retry_policy / ack as the real dispatcher's, but deliverable
    waits while ``gate`` is clear (the real one asks the database now and then)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.checking = asyncio.Event()  # set while a deliverable() call waits at the gate
        self.acks: list[int] = []
        self.sessions: dict[int, set] = {}
        self.allowed = True
        self.metrics = SimpleNamespace(count=lambda *a: None, session=lambda *a: None)

    async def load(self, smuid: int) -> tuple[str, str, Message]:
        return payload(smuid)

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        self.checking.set()
        await self.gate.wait()
        self.checking.clear()
        return self.allowed

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        return DeliveryPolicy(60, 3, queue=False)

    async def ack(self, request: AckRequest, session=None) -> None:
        self.acks.append(request.smuid)


@pytest.fixture
async def session():
    """A consumer after smqp_connect, logged in as far as delivery cares; its writes are
    collected in ``session.written``."""
    consumer = SMQPConsumer()
    consumer.scope = {"type": "smqp", "client": ["127.0.0.1", 4000]}
    written: list[bytes] = []

    async def send(event: dict) -> None:
        written.append(event["bytes"])

    consumer.base_send = send
    await consumer.smqp_connect({"type": "smqp.connect"})
    written.clear()  # the greeting
    consumer.account_id = ACCOUNT
    consumer.session = SimpleNamespace(guid="g1")  # logged in
    consumer.dispatcher = GatedDispatcher()
    consumer.dispatcher.sessions[ACCOUNT] = {consumer}
    consumer.written = written
    yield consumer
    consumer._watchdog.cancel()
    stop(consumer.delivery)


def stop(delivery) -> None:
    """Timers and tasks of a session a test leaves behind (no close: no login row to end)."""
    for handle in (*delivery._retry.values(), delivery._lock_timer, *delivery._tasks):
        if handle is not None:
            handle.cancel()


def offer(session: SMQPConsumer, priority: int, smuid: int) -> None:
    """As the dispatcher offers a message to a session."""
    if session.mailbox.offer(priority, smuid):
        session.kick()


def notified(written: list[bytes]) -> list[int]:
    """smuids of the NOTIFY MESSAGE blocks written, in order."""
    out = []
    for chunk in written:
        for line in chunk.split(b"\r\n"):
            if line.startswith(b"Smuid: "):
                out.append(int(line.rsplit(b"/", 1)[1]))
    return out


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_message_offered_again_while_it_is_prepared_goes_once(session):
    """The bench saw a duplicate: the backlog sweep offered a message that the session had
    just taken from its queue and was checking (its subscribe right: a database call), so it
    was queued a second time and, after its 310 ACK, sent again."""
    dispatcher = session.dispatcher
    dispatcher.gate.clear()
    offer(session, 1, 9)  # its wake-up
    await asyncio.wait_for(dispatcher.checking.wait(), scaled(5))
    offer(session, 1, 9)  # the sweep's backlog read, which saw it committed
    dispatcher.gate.set()
    await settle()
    assert notified(session.written) == [9]
    await session.cmd_ack(c.Ack())
    await settle()
    assert dispatcher.acks == [9]
    assert session.mailbox.inflight is None and session.idle
    assert notified(session.written) == [9]  # not a second time
    offer(session, 1, 10)
    await settle()
    assert notified(session.written) == [9, 10]


async def test_another_session_s_ack_skips_what_waits_not_what_is_on_its_way(session):
    """Every live session of the account gets live messages: one that is already on its way
    here (taken from the queue, NOTIFY being prepared) still goes, as one in flight would;
    one still waiting is skipped once another session of the account ACKed it."""
    dispatcher = session.dispatcher
    dispatcher.gate.clear()
    offer(session, 1, 9)
    offer(session, 1, 10)
    offer(session, 1, 11)
    await asyncio.wait_for(dispatcher.checking.wait(), scaled(5))
    session.mailbox.forget(9)  # on its way
    session.mailbox.forget(10)  # waiting
    dispatcher.gate.set()
    await settle()
    assert notified(session.written) == [9]
    await session.cmd_ack(c.Ack())
    await settle()
    assert notified(session.written) == [9, 11]
    assert not session.mailbox._skip and session.mailbox._queued == set()


async def test_a_message_no_longer_deliverable_is_dropped_and_may_come_again(session):
    """A withdrawn right drops the message here; once allowed again, a later offer (a
    backlog read) sends it."""
    dispatcher = session.dispatcher
    dispatcher.allowed = False
    offer(session, 1, 9)
    await settle()
    assert notified(session.written) == [] and session.idle
    dispatcher.allowed = True
    offer(session, 1, 9)
    await settle()
    assert notified(session.written) == [9]
