"""The dispatcher's place on the dispatch group (two dispatchers on one in-memory channel
layer stand for two processes; the real two-process case is in e2e/smqp/test_durability)."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.delivery import Dispatcher, commit, wakeups
from broker.delivery import dispatcher as delivery
from broker.services.publish import Published
from tests.support.timing import scaled


class Probe:
    """A session of account 42 that records what it is offered."""

    account_id = 42
    idle = True

    def __init__(self) -> None:
        self.offered: list[tuple[int, int]] = []
        self.mailbox = self  # offers go to the session's mailbox

    def offer(self, priority: int, smuid: int, *, live: bool = False) -> bool:
        self.offered.append((priority, smuid))
        return False  # nothing to kick

    def kick(self) -> None:
        pass


@pytest.fixture
def layer(settings):
    from channels.layers import get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return get_channel_layer()


async def test_a_dispatcher_that_cannot_join_at_first_keeps_trying(layer, monkeypatch):
    """Redis down when the first session logs in: the dispatcher joins once it is back (it
    used to give up for good), and a login waits for that a bounded time only."""
    real = layer.group_add
    failures = [1]

    async def flaky(group: str, channel: str) -> None:
        if failures:
            failures.pop()
            raise ConnectionError("redis is down")
        await real(group, channel)

    monkeypatch.setattr(layer, "group_add", flaky)
    monkeypatch.setattr(wakeups, "JOIN_WAIT_SECONDS", 0.1)
    a = Dispatcher()
    probe = Probe()
    a.register(probe)
    try:
        await a.joined()  # gives up waiting after 0.1 s: the retry comes after 1 s
        assert not a.wakeups._joined.done()
        await asyncio.wait_for(asyncio.shield(a.wakeups._joined), scaled(3))
        other = Dispatcher()  # another process commits a message for account 42
        try:
            other.wake([Published(9, 7, "/t", 3, [42])])
            assert await eventually(lambda: probe.offered)  # the wake-up has come
        finally:
            other.close()
        assert probe.offered == [(3, 9)]
    finally:
        a.close()


async def test_a_worker_s_wake_up_is_offered(layer):
    a = Dispatcher()
    probe = Probe()
    a.register(probe)
    try:
        await a.joined()
        await layer.group_send(wakeups.DISPATCH_GROUP, {
            "type": "dispatch.wake", "origin": "", "items": [[3, 9, [42]]]})
        assert await eventually(lambda: probe.offered)
        assert probe.offered == [(3, 9)]
    finally:
        a.close()


async def test_a_message_acked_here_is_not_offered_again_to_its_account(layer, monkeypatch):
    """A backlog read may offer a message once it is committed, before its publish has been
    answered here; its subscriber may ACK it before the publish's wake-up comes. That
    wake-up must not offer it to the account again (the bench saw one duplicate), though
    another account still gets it, and the memory of the ACK fades."""
    from broker.services.ack import AckRequest

    monkeypatch.setattr(delivery, "RECENT_ACK_SECONDS", 0.2)
    a = Dispatcher()
    mine, other = Probe(), Probe()
    other.account_id = 43
    a.register(mine)
    a.register(other)
    try:
        a._acked_here(AckRequest(42, 9, 1, False))
        a.offer([(3, 9, [42, 43])])
        assert mine.offered == [] and other.offered == [(3, 9)]
        a.offer([(3, 10, [42])])  # another message: offered
        assert mine.offered == [(3, 10)]
        await asyncio.sleep(0.3)
        a._acked_here(AckRequest(42, 11, 1, False))  # prunes what has expired
        assert (42, 9) not in a._recent_acks
        a.offer([(3, 9, [42])])
        assert mine.offered == [(3, 10), (3, 9)]
    finally:
        a.close()


async def test_another_process_s_wake_up_is_live_only_for_sessions_live_when_it_was_sent(
        layer):
    """A session that logged in after a wake-up was sent read the store after its commit;
    the account may have ACKed the message on another node since (a client that moved
    here): offering it would deliver it again. The cluster's link-cut test saw 20 fan-out
    messages ACKed twice so."""
    a = Dispatcher()
    before = Probe()
    a.register(before)
    sent_at = time.time()
    await asyncio.sleep(0.01)
    after = Probe()
    a.register(after)
    try:
        a.offer([(3, 9, [42])], sent_at)
        assert before.offered == [(3, 9)] and after.offered == []
        a.offer([(3, 10, [42])])  # this process's own commit: every session
        assert before.offered == [(3, 9), (3, 10)] and after.offered == [(3, 10)]
        # Through the group: the stamp travels with the wake-up.
        await a.joined()
        await layer.group_send(wakeups.DISPATCH_GROUP, {
            "type": "dispatch.wake", "origin": "other", "items": [[3, 11, [42]]],
            "at": sent_at})
        assert await eventually(lambda: (3, 11) in before.offered)
        assert (3, 11) not in after.offered
    finally:
        a.close()


async def test_a_late_wake_up_is_not_offered_the_store_is_read_for_its_accounts(layer,
                                                                               settings):
    """A node cut off from Redis is handed what queued up for it once its link is back:
    wake-ups of messages its accounts may have ACKed elsewhere meanwhile. Past
    SMQP_WAKEUP_MAX_AGE_SECONDS a wake-up offers nothing; the store is read for the accounts
    it names (all their sessions here, busy or not), and only what it still holds goes."""
    settings.SMQP_WAKEUP_MAX_AGE_SECONDS = 1.0
    a = Dispatcher()
    busy, other = Probe(), Probe()
    busy.idle = False
    other.account_id = 43
    reads: list[list[int]] = []

    async def store(account_ids: list[int]) -> tuple[list[tuple[int, int, int]], bool]:
        reads.append(sorted(account_ids))
        return [(42, 3, 9)], False  # 8 was ACKed on another node; 9 is still due

    a.sweeps._backlog = store
    a.register(busy)
    a.register(other)
    try:
        a.offer([(3, 8, [42]), (3, 9, [42, 44])], time.time() - 5)
        assert busy.offered == []  # nothing offered as live
        assert await eventually(lambda: busy.offered)
        assert busy.offered == [(3, 9)] and other.offered == []
        assert reads == [[42]]  # one read, of the accounts with a session here
        a.offer([(3, 12, [42])], time.time())  # on time: live as before
        assert busy.offered == [(3, 9), (3, 12)]
    finally:
        a.close()


class AckStore:
    """Stands for the storage processes: records each ACK batch (its smuids)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def ack_batch(self, acks: list) -> list:
        self.batches.append([ack.smuid for ack in acks])
        return []

    def close(self) -> None:
        pass


async def test_journaled_acks_reach_the_store_in_gathered_batches(layer, settings, tmp_path,
                                                                  monkeypatch):
    """An ACK after a quiet spell goes to the store at once; the ACKs that follow gather
    (one transaction for many), until ACK_GATHER_SECONDS have passed, a backlog read waits
    for them (caught_up), or MAX_BATCH are queued."""
    from broker.services.ack import AckRequest

    settings.VAR_DIR = tmp_path  # the journal's folder
    settings.SMQP_ACK_JOURNAL = True
    monkeypatch.setattr(commit, "ACK_GATHER_SECONDS", 0.5)
    a = Dispatcher()
    a.storage.close()
    store = a.commits.storage = AckStore()

    async def acked(*smuids: int) -> None:
        for smuid in smuids:
            await a.ack(AckRequest(42, smuid, 1, False))

    async def until(count: int) -> None:
        for _ in range(300):
            if len(store.batches) >= count:
                return
            await asyncio.sleep(0.01)

    try:
        await acked(1)
        await until(1)
        assert store.batches == [[1]]
        await acked(2, 3, 4)
        await asyncio.sleep(0.1)
        assert store.batches == [[1]]  # gathering
        monkeypatch.setattr(commit, "ACK_GATHER_SECONDS", 30)  # the pause after the next
        await until(2)
        assert store.batches == [[1], [2, 3, 4]]
        # A pause of 30 s runs now; a backlog read does not wait it out.
        await acked(5)
        await asyncio.wait_for(a.caught_up(), scaled(10))
        assert store.batches == [[1], [2, 3, 4], [5]]
        # Another pause of 30 s: MAX_BATCH queued ACKs end it.
        monkeypatch.setattr(commit, "MAX_BATCH", 3)
        await acked(6, 7)
        await asyncio.sleep(scaled(0.1))  # a quiet window: the 30-s pause is running
        assert len(store.batches) == 3
        await acked(8)
        await until(4)
        assert store.batches[3] == [6, 7, 8]
        assert not a.commits.journal.pending
    finally:
        a.close()


async def eventually(condition, timeout: float = 5.0) -> bool:
    """Wait until ``condition()`` holds (at most ``scaled(timeout)`` seconds); its last
    value."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.01)
    return bool(condition())


async def test_wake_ups_go_to_other_processes_only_while_there_are_any(layer, monkeypatch):
    """A dispatcher alone on the group sends no wake-ups; one that joins says hello and is
    answered, so both wake each other at once; one that is gone is forgotten."""
    monkeypatch.setattr(wakeups, "PEER_STARTUP_SECONDS", 0)
    # Hellos when joining only: b learns of a from a's answer.
    monkeypatch.setattr(wakeups, "PEER_HELLO_SECONDS", 600)
    monkeypatch.setattr(wakeups, "PEER_FORGET_SECONDS", 600)
    sent: list[str] = []
    real = layer.group_send

    async def spy(group: str, message: dict) -> None:
        if message["type"] == "dispatch.wake":
            sent.append(message["origin"])
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    a, mine = Dispatcher(), Probe()
    a.register(mine)
    try:
        await a.joined()
        a.wake([Published(9, 7, "/t", 3, [42])])
        assert await eventually(lambda: mine.offered)
        await asyncio.sleep(scaled(0.1))  # a quiet window: no wake-up goes out
        assert mine.offered == [(3, 9)] and sent == []  # offered here, told nobody
        b, theirs = Dispatcher(), Probe()
        b.register(theirs)
        try:
            await b.joined()
            assert await eventually(lambda: a.wakeups._has_peers() and b.wakeups._has_peers())
            a.wake([Published(10, 7, "/t", 3, [42])])
            b.wake([Published(11, 7, "/t", 3, [42])])
            assert await eventually(lambda: (3, 10) in theirs.offered and (3, 11) in mine.offered)
            assert sorted(sent) == sorted([a.origin, b.origin])
        finally:
            b.close()
        monkeypatch.setattr(wakeups, "PEER_FORGET_SECONDS", 0.3)
        assert await eventually(lambda: not a.wakeups._has_peers())
        sent.clear()
        a.wake([Published(12, 7, "/t", 3, [42])])
        assert await eventually(lambda: (3, 12) in mine.offered)
        await asyncio.sleep(scaled(0.1))  # a quiet window: no wake-up goes out
        assert (3, 12) in mine.offered and sent == []
    finally:
        a.close()


async def test_without_a_journal_a_backlog_read_does_not_bring_back_what_was_acked_during_it(
        layer, settings, monkeypatch):
    """SMQP_ACK_JOURNAL=0: 310 ACK waits for the ACK's commit. A backlog read whose query
    began before that commit still returns the message; it must not be offered again. An ACK
    whose batch failed (its session answered 500) is not left out of later reads."""
    from broker.services import ServiceError
    from broker.services.ack import AckRequest

    settings.SMQP_ACK_JOURNAL = False
    a = Dispatcher()
    a.storage.close()
    store = a.commits.storage = AckStore()
    assert a.commits.journal is None
    query_may_answer = asyncio.Event()
    query_began = asyncio.Event()

    async def stored_rows(fn, account_ids):  # stands for backlog_for on the database thread
        query_began.set()
        await query_may_answer.wait()
        return [(42, 1, 9), (42, 1, 10)]

    monkeypatch.setattr(commit.dbthread, "run", stored_rows)
    try:
        read = asyncio.ensure_future(a.backlog([42]))
        await asyncio.wait_for(query_began.wait(), scaled(5))  # its query has begun
        await asyncio.wait_for(a.ack(AckRequest(42, 9, 1, False)), scaled(5))
        assert store.batches == [[9]]
        query_may_answer.set()
        rows, _ = await asyncio.wait_for(read, scaled(5))
        assert rows == [(42, 1, 10)]
        # A later read: its query sees the commit (here: the store no longer has 9).

        async def failing(acks: list) -> list:
            raise RuntimeError("database down")

        monkeypatch.setattr(store, "ack_batch", failing)
        with pytest.raises(ServiceError):
            await asyncio.wait_for(a.ack(AckRequest(42, 10, 1, False)), scaled(5))
        rows, _ = await asyncio.wait_for(a.backlog([42]), scaled(5))
        assert (42, 1, 10) in rows  # not recorded: offered again
    finally:
        a.close()


class Forgetting(Probe):
    """A session of account 42 that records what its mailbox is told to forget."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: list[tuple[int, bool]] = []

    def forget(self, smuid: int, *, live_too: bool = False) -> None:
        self.forgotten.append((smuid, live_too))


async def test_an_ack_through_the_dispatcher_is_committed_once_for_its_account(layer, settings):
    """The dispatcher's part of an ACK around the group commit's: the account's other
    sessions skip the message, and another of its sessions ACKing it too is not committed
    again."""
    from broker.services.ack import AckRequest

    settings.SMQP_ACK_JOURNAL = False
    a = Dispatcher()
    a.storage.close()
    store = a.commits.storage = AckStore()
    acking, other = Forgetting(), Forgetting()
    a.register(acking)
    a.register(other)
    try:
        await asyncio.wait_for(a.ack(AckRequest(42, 9, 1, False), acking), scaled(5))
        assert store.batches == [[9]]
        assert other.forgotten == [(9, False)] and acking.forgotten == []
        assert (42, 9) in a._recent_acks
        await asyncio.wait_for(a.ack(AckRequest(42, 9, 1, False), other), scaled(5))
        assert store.batches == [[9]]  # recorded already for the account
    finally:
        a.close()
