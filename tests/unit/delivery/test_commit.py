"""The group commit (:class:`broker.delivery.commit.GroupCommit`), alone: stand-ins for the
storage processes and for the dispatcher it reports to (no socket, no database). How batches
are cut and paced: test_batches; journaled ACKs gathering and backlog reads against ACKs in
flight, through the dispatcher: test_dispatch_group."""

from __future__ import annotations

import asyncio

import pytest

from broker.delivery.commit import GroupCommit
from broker.services import ServiceError
from broker.services.ack import AckRequest
from broker.services.publish import Published, PublishRequest
from broker.smqp.message import DataSection, Message
from broker.store import opsmetrics
from tests.support.timing import async_wait_until, scaled


class Store:
    """Stands for the storage processes: commits what it is given when the test lets it."""

    publish_window = (4, 2, 32)

    def __init__(self) -> None:
        self.acks: list[list[int]] = []
        self.ack_may_commit = asyncio.Event()
        self.ack_may_commit.set()
        self.fail_acks = False
        self.failed = 0  # ack batches refused while fail_acks

    async def publish_batch(self, requests: list[PublishRequest]) -> list:
        results: list = []
        for i, request in enumerate(requests):
            if request.topic == "/refused":
                results.append(ServiceError(401, "Unauthorized"))
            else:
                message = request.message
                results.append(Published(100 + i, 7, request.topic, 2, [42],
                                         (request.topic, request.cmuid, message)))
        return results

    async def ack_batch(self, requests: list[AckRequest]) -> list:
        await self.ack_may_commit.wait()
        if self.fail_acks:
            self.failed += 1
            raise RuntimeError("database down")
        self.acks.append([r.smuid for r in requests])
        return [Published(900, 7, "/receipts", 1, [41])]

    def close(self) -> None:
        pass


class Dispatcher:
    """What the group commit reports to (the dispatcher's wake, cache and ACK memory)."""

    def __init__(self) -> None:
        self.woken: list[list[int]] = []
        self.remembered: list[int] = []
        self.recorded: list[int] = []

    def wake(self, published: list[Published]) -> None:
        self.woken.append([p.smuid for p in published])

    def remember(self, smuid: int, payload) -> None:
        self.remembered.append(smuid)

    def record(self, request: AckRequest) -> None:
        self.recorded.append(request.smuid)


@pytest.fixture
async def commits(settings, tmp_path):
    settings.VAR_DIR = tmp_path  # the journal's folder, when there is one
    settings.SMQP_ACK_JOURNAL = False
    heard = Dispatcher()
    group = GroupCommit(opsmetrics.Recorder(), heard.wake, heard.remember, heard.record)
    group.storage.close()
    group.storage = Store()
    try:
        yield group, heard
    finally:
        group.close()


def request(path: str, cmuid: str) -> PublishRequest:
    return PublishRequest(1, "g", "MESSAGE", path, cmuid,
                          Message([], [DataSection([], b"x")]))


async def test_publishes_are_answered_once_committed_and_reported(commits):
    group, heard = commits
    ok, refused = group.publish(request("/t", "c1")), group.publish(request("/refused", "c2"))
    assert group.queued == (2, 0)
    published = await asyncio.wait_for(ok, scaled(5))
    assert published.smuid == 100 and published.payload[1] == "c1"
    with pytest.raises(ServiceError) as refusal:
        await asyncio.wait_for(refused, scaled(5))
    assert refusal.value.code == 401  # that publish alone fails
    assert group.queued == (0, 0)
    # The dispatcher hears of what was committed, and keeps its payload for NOTIFY.
    assert heard.woken == [[100]] and heard.remembered == [100]


async def test_without_a_journal_an_ack_is_recorded_once_its_batch_committed(commits):
    group, heard = commits
    store = group.storage
    store.ack_may_commit.clear()
    acked = asyncio.ensure_future(group.ack(AckRequest(42, 9, 1, False)))
    await asyncio.sleep(scaled(0.01))  # a quiet window: the batch waits for its COMMIT
    assert not acked.done() and heard.recorded == []  # not before its COMMIT
    assert group.acked == {(42, 9): float("inf")}  # left out of backlog reads meanwhile
    store.ack_may_commit.set()
    await asyncio.wait_for(acked, scaled(5))
    assert store.acks == [[9]] and heard.recorded == [9]
    assert heard.woken == [[900]]  # the receipts the batch sent
    # A batch that fails: the ACK is not recorded, and backlog reads offer it again.
    store.fail_acks = True
    with pytest.raises(ServiceError):
        await asyncio.wait_for(group.ack(AckRequest(42, 10, 1, False)), scaled(5))
    assert heard.recorded == [9] and (42, 10) not in group.acked


async def test_a_journaled_ack_is_recorded_before_its_batch_commits(commits, settings):
    group, heard = commits
    group.close()  # a group commit with a journal instead
    settings.SMQP_ACK_JOURNAL = True
    settings.SMQP_ACK_DURABILITY = "full"
    group = GroupCommit(opsmetrics.Recorder(), heard.wake, heard.remember, heard.record)
    group.storage.close()
    store = group.storage = Store()
    store.ack_may_commit.clear()
    try:
        # journaled, flushed
        await asyncio.wait_for(group.ack(AckRequest(42, 9, 1, False)), scaled(5))
        assert heard.recorded == [9] and store.acks == []
        assert group.journal.pending
        await asyncio.wait_for(group.durable(), scaled(5))  # flushes again, returns
        store.ack_may_commit.set()
        await asyncio.wait_for(group.caught_up(), scaled(5))
        assert store.acks == [[9]] and not group.journal.pending
    finally:
        group.close()


async def test_without_a_journal_a_written_ack_goes_again_until_it_commits(commits):
    """A written-is-delivered ACK (an XMPP fan-out item, profile §3) while the database
    fails over: the item went, so the ACK is kept and retried, never dropped (it was dropped
    with the failed batch, and the item stayed pending in the store while its live session
    believed it delivered). A client's ACK in the same failed batch is answered with the
    failure instead, and is not retried."""
    group, heard = commits
    store = group.storage
    store.fail_acks = True
    await asyncio.wait_for(group.ack(AckRequest(42, 11, 1, False), written=True), scaled(5))
    # Recorded at once: the account's other sessions skip it, backlog reads leave it out.
    assert heard.recorded == [11] and group.acked == {(42, 11): float("inf")}
    client = asyncio.ensure_future(group.ack(AckRequest(42, 12, 1, False)))
    with pytest.raises(ServiceError):
        await asyncio.wait_for(client, scaled(5))
    retried = store.failed + 3  # a few failed retries of 11 (awaited, not slept for)

    async def retried_enough() -> bool:
        return store.failed >= retried

    await async_wait_until(retried_enough, 5, message="three failed retries")
    assert store.acks == [] and group.queued == (0, 1)
    store.fail_acks = False
    for _ in range(100):
        if store.acks:
            break
        await asyncio.sleep(0.05)
    assert store.acks == [[11]]  # 11 alone: 12 failed and was answered so
    assert group.acked.get((42, 11)) != float("inf") and (42, 12) not in group.acked
