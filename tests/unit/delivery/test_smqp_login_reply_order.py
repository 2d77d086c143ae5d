"""Issue 34 item 13: a NOTIFY MESSAGE must never start before the login reply (``200-OK`` ...
``200 Guid: ...``) has ended. The session registers with the dispatcher before it reads its
backlog (so that no wake-up is missed), and a wake-up or the backlog sweep may offer it a
message from then on: the pump may run while the login is still being set up. Driven here
through the consumer with a stand-in dispatcher that holds the login open at the point a
wake-up can come, and a transport that records each write. Over real sockets:
e2e/smqp/test_login_reply_order."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import broker.consumers.smqp as smqp_consumer
from broker.consumers.smqp import SMQPConsumer
from broker.services import auth as auth_service
from broker.services.read import DeliveryPolicy
from tests.support.timing import scaled
from tests.unit.delivery.test_smqp_session_delivery import ACCOUNT, payload, stop

GUID = b"alice0001"


class LoginDispatcher:
    """What a login and the pump ask of the dispatcher; ``caught_up`` waits at ``gate`` (the
    real one waits for this process's ACK journal: a moment a wake-up can come in)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.registered: list = []
        self.metrics = SimpleNamespace(count=lambda *a: None, session=lambda *a: None)

    def register(self, session) -> None:
        self.registered.append(session)

    def unregister(self, session) -> None:
        self.registered.remove(session)

    async def joined(self) -> None:
        pass

    async def caught_up(self) -> None:
        self.waiting.set()
        await self.gate.wait()

    async def backlog(self, account_ids):
        return [], False

    async def load(self, smuid: int):
        return payload(smuid)

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        return True

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        return DeliveryPolicy(60, 3, queue=False)


@pytest.fixture
async def consumer(monkeypatch):
    dispatcher = LoginDispatcher()
    account = SimpleNamespace(pk=ACCOUNT, account_topic_path="/accounts/alice")
    monkeypatch.setattr(smqp_consumer, "get_dispatcher", lambda: dispatcher)
    async def admitted(host, user):
        return auth_service.Throttle(refused=False, delay=0.0)

    monkeypatch.setattr(auth_service, "admit_attempt", admitted)
    monkeypatch.setattr(auth_service, "check_clear_password", lambda user, secret: account)
    monkeypatch.setattr(SMQPConsumer, "_begin_session",
                        lambda self, account, method: SimpleNamespace(guid=GUID.decode()))
    session = SMQPConsumer()
    session.scope = {"type": "smqp", "client": ["127.0.0.1", 4000]}
    session.channel_layer = None
    written: list[bytes] = []

    async def send(event: dict) -> None:
        written.append(event["bytes"])
        await asyncio.sleep(0)  # a real transport's send may yield (flow control)

    session.base_send = send
    await session.smqp_connect({"type": "smqp.connect"})
    written.clear()  # the greeting
    session.login.login("alice", "CLEAR", "1.0")  # as after LOGIN alice CLEAR/1.0
    session.written = written
    yield session, dispatcher
    session._watchdog.cancel()
    stop(session.delivery)


def assert_reply_before_notify(stream: bytes) -> None:
    end = stream.index(b"200 Guid: " + GUID + b"\r\n")
    assert stream.startswith(b"200-OK\r\n"), stream[:200]
    notify = stream.find(b"NOTIFY MESSAGE")
    assert notify != -1, stream
    assert notify > end, f"NOTIFY at byte {notify}, login reply ends at {end}: {stream!r}"


async def test_a_wake_up_during_login_waits_for_the_whole_login_reply(consumer):
    """A message committed while PASS is being answered (after the session registered, before
    its reply is out) is offered to it, and the pump starts at once: its NOTIFY must still
    come after the reply's last line."""
    session, dispatcher = consumer
    login = asyncio.ensure_future(session.smqp_receive(
        {"type": "smqp.receive", "bytes": b"PASS alice secret\r\n"}))
    await asyncio.wait_for(dispatcher.waiting.wait(), scaled(5))
    assert dispatcher.registered == [session]
    # The wake-up of a publish committed now (as Dispatcher.offer does it).
    if session.mailbox.offer(1, 7, live=True):
        session.kick()
    for _ in range(20):  # the pump gets every chance to write before the login goes on
        await asyncio.sleep(0)
    dispatcher.gate.set()
    await asyncio.wait_for(login, scaled(5))
    for _ in range(20):
        await asyncio.sleep(0)
    assert_reply_before_notify(b"".join(session.written))


async def test_a_backlog_offered_at_login_follows_the_login_reply(consumer):
    """The login's own backlog read kicks the pump: the NOTIFY still follows the reply,
    whatever the order of the writes."""
    session, dispatcher = consumer

    async def backlog(account_ids):
        return [(ACCOUNT, 1, 5)], False

    dispatcher.backlog = backlog
    dispatcher.gate.set()
    await asyncio.wait_for(session.smqp_receive(
        {"type": "smqp.receive", "bytes": b"PASS alice secret\r\n"}), scaled(5))
    for _ in range(20):
        await asyncio.sleep(0)
    assert_reply_before_notify(b"".join(session.written))
