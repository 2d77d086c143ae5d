"""Issue 34 item 1 at the SMQP door: a session ends whenever its transport ends, by whatever
path. Before the door base (broker/consumers/base.py) the SMQP consumer ended its session
only at ``smqp.disconnect``: a handler's exception, or the server cancelling the instance,
left it registered with its queue-mode locks held until the deadline sweep. Driven through
the consumer's ASGI loop with a stand-in dispatcher; no socket, no database."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import broker.consumers.base as door_base
import broker.delivery.session as session_module
from broker.consumers.smqp import SMQPConsumer
from tests.support.timing import scaled
from tests.unit.delivery.test_subscriber_session import GUID, FakeDispatcher

CONNECT = {"type": "smqp.connect"}


@pytest.fixture
def ended(monkeypatch):
    logins: list[str] = []

    async def end_login(login) -> None:
        logins.append(login.guid)

    monkeypatch.setattr(session_module, "_end_login", end_login)
    monkeypatch.setattr(door_base, "get_channel_layer", lambda alias: None)
    return logins


async def serve(consumer: SMQPConsumer, then) -> tuple[FakeDispatcher, asyncio.Task]:
    """Run the consumer's loop: connected, logged in with a queue-mode lock taken, then
    ``then()`` is what its next receive does."""
    dispatcher = FakeDispatcher()
    logged_in = asyncio.Event()
    calls = 0

    async def receive() -> dict:
        nonlocal calls
        calls += 1
        if calls == 1:
            return CONNECT
        consumer.account = SimpleNamespace(pk=7)
        consumer.account_id = 7
        consumer.session = SimpleNamespace(guid=GUID)
        consumer.dispatcher = dispatcher
        dispatcher.register(consumer)
        consumer.delivery._took_locks = True  # as after a queue-mode lock
        logged_in.set()
        return await then()

    async def send(event: dict) -> None:
        pass

    consumer.scope = {"type": "smqp", "client": ["127.0.0.1", 4000]}
    task = asyncio.ensure_future(consumer({"type": "smqp", "client": ["127.0.0.1", 4000]},
                                          receive, send))
    await asyncio.wait_for(logged_in.wait(), scaled(5))
    return dispatcher, task


def assert_ended(consumer: SMQPConsumer, dispatcher: FakeDispatcher, logins: list) -> None:
    assert logins == [GUID]
    assert dispatcher.of("release") == [("release", None)]
    assert dispatcher.registered == []
    assert consumer.session is None and consumer.delivery.closed


async def test_an_exception_in_the_loop_ends_the_session(ended):
    consumer = SMQPConsumer()

    async def fail() -> dict:
        raise RuntimeError("the transport broke")

    dispatcher, task = await serve(consumer, fail)
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(task, scaled(5))
    assert_ended(consumer, dispatcher, ended)


async def test_a_cancelled_instance_ends_its_session(ended):
    consumer = SMQPConsumer()
    forever = asyncio.Event()

    async def wait() -> dict:
        await forever.wait()
        return {}

    dispatcher, task = await serve(consumer, wait)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(20):  # the shielded end goes on after the cancellation
        await asyncio.sleep(0)
    assert_ended(consumer, dispatcher, ended)


async def test_the_disconnect_and_the_loop_s_end_end_it_once(ended):
    consumer = SMQPConsumer()

    async def disconnect() -> dict:
        return {"type": "smqp.disconnect"}

    dispatcher, task = await serve(consumer, disconnect)
    await asyncio.wait_for(task, scaled(5))
    assert_ended(consumer, dispatcher, ended)
