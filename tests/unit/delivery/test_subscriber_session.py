"""The subscriber session every door shares (broker.delivery.session), against a stand-in
dispatcher and a stand-in door: no socket, no database. Each door's wire behaviour over real
sockets is in e2e/smqp (test_messages, test_queue_locks, test_backlog) and e2e/xmpp
(test_xmpp, test_queue_workers, test_fanout_sessions, test_dropped_streams)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import broker.delivery.session as session_module
from broker.delivery.session import Held, SubscriberSession
from broker.services import ServiceError, conflict
from broker.services.read import DeliveryPolicy
from tests.support.timing import scaled
from tests.unit.delivery.test_smqp_session_delivery import ACCOUNT, TOPIC, payload

GUID = "guid-1"
FAN_OUT = DeliveryPolicy(60, 3, queue=False)
QUEUE = DeliveryPolicy(60, 3, queue=True)


class FakeDispatcher:
    """What a session asks of the dispatcher; every call that matters goes to ``log``."""

    def __init__(self, policy: DeliveryPolicy = FAN_OUT) -> None:
        self.policy = policy
        self.log: list[tuple] = []
        self.registered: list = []
        self.backlog_pages: list[tuple[list[tuple[int, int, int]], bool]] = []
        self.lock_ok = True
        self.lock_lost = False  # ack_locked: the store says the lock is no longer held
        self.metrics = SimpleNamespace(count=lambda *a: None, session=lambda *a: None)

    def register(self, session) -> None:
        self.registered.append(session)

    def unregister(self, session) -> None:
        self.registered.remove(session)
        self.log.append(("unregister",))

    async def caught_up(self) -> None:
        pass

    async def backlog(self, account_ids: list[int]):
        self.log.append(("backlog", tuple(account_ids)))
        return self.backlog_pages.pop(0) if self.backlog_pages else ([], False)

    async def load(self, smuid: int):
        return payload(smuid)

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        return True

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        return self.policy

    async def lock(self, account_id, guid, smuid, policy) -> bool:
        self.log.append(("lock", smuid))
        return self.lock_ok

    async def ack(self, request, session=None, written=False) -> None:
        self.log.append(("ack", request.smuid))

    async def ack_locked(self, request, guid, session=None) -> None:
        if self.lock_lost:
            raise conflict("lock not held")
        self.log.append(("ack_locked", request.smuid))

    async def release(self, account_id, guid, smuids=None, unsent=()) -> None:
        self.log.append(("release", None if smuids is None else tuple(smuids)))
        self.unsent_released = sorted(unsent)

    async def dead(self, account_id, smuid) -> None:
        self.log.append(("dead", smuid))

    def of(self, kind: str) -> list[tuple]:
        return [entry for entry in self.log if entry[0] == kind]


class FakeDoor:
    """The door's wire work: writes go to the dispatcher's log (so their order against
    locks and ACKs shows), or fail while ``failing``."""

    peer = "test"

    def __init__(self, log: list, *, acks_on_write: bool = False,
                 credit: int | None = None) -> None:
        self.log = log
        self.acks_on_write = acks_on_write
        self.credit = credit
        self.closing = False
        self.sendable = True
        self.failing = False
        self.expired: list[Held] = []
        self.failures: list[str] = []
        self.wrote = asyncio.Event()

    def may_send(self) -> bool:
        return self.sendable

    def queue_credit(self, topic: str) -> int | None:
        return self.credit

    async def write_message(self, smuid: int, payload) -> bool:
        if self.failing:
            return False
        self.log.append(("write", smuid))
        self.wrote.set()
        return True

    async def locks_expired(self, held: list[Held]) -> None:
        self.expired.extend(held)

    def failed(self, what: str, exc: BaseException | None = None) -> None:
        self.failures.append(what)

    def writes(self) -> list[int]:
        return [entry[1] for entry in self.log if entry[0] == "write"]


@pytest.fixture
def ended(monkeypatch):
    """Login sessions the session ended (instead of their database row)."""
    logins: list = []

    async def end_login(login) -> None:
        logins.append(login.guid)

    monkeypatch.setattr(session_module, "_end_login", end_login)
    return logins


def make(policy: DeliveryPolicy = FAN_OUT, *, page: int = 100, **door_options):
    dispatcher = FakeDispatcher(policy)
    door = FakeDoor(dispatcher.log, **door_options)
    session = SubscriberSession(door, page, door_name="xmpp" if door.acks_on_write else "smqp")
    session.account_id = ACCOUNT
    session.session = SimpleNamespace(guid=GUID)
    session.register(dispatcher)
    return session, dispatcher, door


def offer(session: SubscriberSession, *smuids: int, priority: int = 1) -> None:
    """As the dispatcher offers messages."""
    for smuid in smuids:
        if session.mailbox.offer(priority, smuid, live=True):
            session.kick()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_dispatcher_sees_the_session_protocol():
    session, dispatcher, _ = make()
    assert dispatcher.registered == [session]
    assert session.account_id == ACCOUNT and session.session.guid == GUID
    assert session.idle
    offer(session, 5)
    assert not session.idle


async def test_the_pump_sends_one_at_a_time_until_its_ack(ended):
    session, dispatcher, door = make()
    offer(session, 1, 2, 3)
    await settle()
    assert door.writes() == [1]
    assert await session.ack_inflight()
    assert dispatcher.of("ack") == [("ack", 1)]
    await session.pump_here()
    assert door.writes() == [1, 2]
    assert await session.ack_inflight()
    await session.pump_here()
    assert await session.ack_inflight()
    assert door.writes() == [1, 2, 3] and dispatcher.of("ack") == [("ack", 1), ("ack", 2),
                                                                   ("ack", 3)]
    assert not await session.ack_inflight()  # nothing waits for an ACK
    await session.close()


async def test_nothing_goes_while_the_door_may_not_send(ended):
    session, _, door = make()
    door.sendable = False
    offer(session, 1)
    await settle()
    assert door.writes() == []
    door.sendable = True
    session.kick()
    await settle()
    assert door.writes() == [1]
    await session.close()


async def test_without_ack_it_goes_again_at_its_deadline_then_is_given_up(ended):
    """Retry timeout 0: the timer runs at the next turn of the loop. Max retries 1: sent
    twice, then recorded dead, and the next message goes (and so on)."""
    session, dispatcher, door = make(DeliveryPolicy(0, 1, queue=False))
    offer(session, 7, 8)
    await asyncio.wait_for(_until(lambda: len(dispatcher.of("dead")) == 2), scaled(5))
    assert dispatcher.of("dead") == [("dead", 7), ("dead", 8)]
    assert door.writes() == [7, 7, 8, 8]
    assert dispatcher.of("ack") == []  # never ACKed without its holder's ACK
    assert session.idle
    await session.close()


async def test_queue_mode_locks_before_writing_and_close_releases(ended):
    session, dispatcher, _ = make(QUEUE)
    offer(session, 4)
    await settle()
    assert dispatcher.log[:2] == [("lock", 4), ("write", 4)]
    assert session.mailbox.holds(4)
    await session.close()
    assert ("release", None) in dispatcher.log
    assert ended == [GUID] and session.session is None
    assert dispatcher.registered == []


async def test_locked_items_never_written_give_their_attempt_back_at_close(ended):
    """Issue 34 item 1: a stream that ends between a lock and its write (or before the
    door's flush wrote the frame) must not spend the item's retries."""
    session, dispatcher, door = make(QUEUE, acks_on_write=True, credit=4)
    door.failing = True  # the stream is ending: the frame is not written
    offer(session, 4)
    await settle()
    assert dispatcher.of("lock") == [("lock", 4)] and door.writes() == []
    await session.close()
    assert dispatcher.unsent_released == [4]

    session, dispatcher, door = make(QUEUE, acks_on_write=True, credit=4)
    offer(session, 5)
    await settle()
    session.defer_acks()  # 6 goes into a frame the door holds for its flush ...
    offer(session, 6)
    await settle()
    await session.flush_acks(written=False)  # ... which never went
    assert dispatcher.of("lock") == [("lock", 5), ("lock", 6)]
    await session.close()
    assert dispatcher.unsent_released == [6]  # 5 was written: its attempt counts


async def test_a_message_whose_lock_fails_is_not_written(ended):
    session, dispatcher, door = make(QUEUE)
    dispatcher.lock_ok = False
    offer(session, 4)
    await settle()
    assert dispatcher.of("lock") == [("lock", 4)] and door.writes() == []
    assert session.mailbox.inflight is None
    await session.close()


async def test_queue_mode_ack_after_the_lock_was_lost_is_refused(ended):
    session, dispatcher, _ = make(QUEUE)
    offer(session, 4)
    await settle()
    dispatcher.lock_lost = True
    with pytest.raises(ServiceError) as refused:
        await session.ack_inflight()
    assert refused.value.code == 409
    assert dispatcher.of("ack_locked") == [] and ("release", (4,)) in dispatcher.log
    assert session.mailbox.inflight is None and not session.mailbox.holds(4)
    await session.close()


async def test_close_is_idempotent(ended):
    session, dispatcher, door = make(QUEUE)
    offer(session, 4)
    await settle()
    await session.close()
    await session.close()
    assert dispatcher.of("release") == [("release", None)]
    assert dispatcher.of("unregister") == [("unregister",)]
    assert ended == [GUID]
    assert dispatcher.of("ack_locked") == []  # its lock went back; nothing consumed
    session.mailbox.acked(4)
    offer(session, 5)  # an offer after the end starts nothing
    await settle()
    assert door.writes() == [4] and not session.idle


async def test_close_while_the_pump_waits_stops_it(ended):
    """A lock being asked for when the transport ends: the pump is cancelled, and the
    session's locks are released all the same (the lock may have been taken)."""
    session, dispatcher, door = make(QUEUE)
    gate = asyncio.Event()
    taken = dispatcher.lock

    async def slow_lock(*args):
        await gate.wait()
        return await taken(*args)

    dispatcher.lock = slow_lock
    offer(session, 4)
    await settle()
    await session.close()
    gate.set()
    await settle()
    assert door.writes() == [] and dispatcher.of("release") == [("release", None)]


async def test_backlog_page_is_read_on_need_page(ended):
    """A page of two in memory: the third offer is beyond it (it is in the store), and is
    read with the next page once the two went."""
    session, dispatcher, door = make(page=2)
    offer(session, 1, 2, 3)
    await settle()
    assert door.writes() == [1]
    dispatcher.backlog_pages.append(([(ACCOUNT, 1, 3)], False))
    for _ in range(3):
        assert await session.ack_inflight()
        await session.pump_here()
    assert door.writes() == [1, 2, 3]
    assert dispatcher.of("backlog") == [("backlog", (ACCOUNT,))]
    await session.close()


# ------------------------------------------------------------ written is delivered (XMPP)

async def test_a_fan_out_message_is_acked_once_written(ended):
    session, dispatcher, _ = make(acks_on_write=True)
    offer(session, 1, 2)
    await settle()
    assert dispatcher.log == [("write", 1), ("ack", 1), ("write", 2), ("ack", 2)]
    assert session.idle
    await session.close()


async def test_a_write_that_fails_does_not_ack(ended):
    session, dispatcher, door = make(acks_on_write=True)
    door.failing = True
    offer(session, 1)
    await settle()
    assert dispatcher.of("ack") == []
    assert session.mailbox.inflight == 1  # not delivered
    await session.close()


async def test_acks_deferred_to_the_door_s_flush(ended):
    """Frames the door holds for its flush: ACKed once the flush wrote them, never if it
    failed."""
    session, dispatcher, door = make(acks_on_write=True)
    session.defer_acks()
    offer(session, 1)
    await settle()
    assert door.writes() == [1] and dispatcher.of("ack") == []
    await session.flush_acks(written=True)
    assert dispatcher.of("ack") == [("ack", 1)]
    session.defer_acks()
    offer(session, 2)
    await settle()
    await session.flush_acks(written=False)
    assert dispatcher.of("ack") == [("ack", 1)]
    await session.close()


async def test_queue_items_are_held_up_to_the_credit_and_parked_beyond(ended):
    session, dispatcher, door = make(QUEUE, acks_on_write=True, credit=1)
    offer(session, 1, 2)
    await settle()
    assert door.writes() == [1]
    assert session.held == {1: Held(TOPIC, "1")}
    assert session.held_by_id == {(TOPIC, "1"): 1}
    assert list(session.parked) == [TOPIC.casefold()]
    assert [smuid for _, smuid in session.parked[TOPIC]] == [2]
    await session.consume(1)
    assert dispatcher.of("ack_locked") == [("ack_locked", 1)]
    await settle()
    assert door.writes() == [1, 2] and list(session.held) == [2]
    await session.close()
    assert dispatcher.of("release") == [("release", None)]


async def test_no_credit_takes_nothing(ended):
    session, dispatcher, door = make(QUEUE, acks_on_write=True, credit=0)
    offer(session, 1)
    await settle()
    assert dispatcher.of("lock") == [] and door.writes() == []
    await session.close()


async def test_consuming_a_lock_lost_in_the_store_is_refused_and_released(ended):
    session, dispatcher, _ = make(QUEUE, acks_on_write=True, credit=4)
    offer(session, 1)
    await settle()
    dispatcher.lock_lost = True
    with pytest.raises(ServiceError) as refused:
        await session.consume(1)
    assert refused.value.code == 409 and ("release", (1,)) in dispatcher.log
    assert session.held == {}
    await session.close()


async def test_an_expired_lock_is_released_and_the_door_told(ended):
    """Retry timeout 0: the held item's lock deadline is now; its timer ends it."""
    session, dispatcher, door = make(DeliveryPolicy(0, 3, queue=True), acks_on_write=True,
                                     credit=4)
    offer(session, 1)
    await asyncio.wait_for(_until(lambda: door.expired), scaled(5))
    assert door.expired == [Held(TOPIC, "1")]
    assert dispatcher.of("release") == [("release", (1,))]
    assert session.held == {} and not session.mailbox.holds(1)
    await session.close()


async def test_unavailable_releases_every_held_item(ended):
    session, dispatcher, door = make(QUEUE, acks_on_write=True, credit=4)
    offer(session, 1, 2)
    await settle()
    assert sorted(session.held) == [1, 2]
    door.sendable = False
    await session.release_all()
    assert session.held == {} and session.mailbox.locks_held == frozenset()
    assert dispatcher.of("release") == [("release", None)]
    await session.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


async def test_a_failing_pump_goes_to_the_door_s_error_funnel(ended):
    """A load that fails (the store away) ends that pass only: the door logs it, and the
    message is not left half taken (offered again, it goes)."""
    session, dispatcher, door = make()
    loaded = dispatcher.load

    async def broken(smuid: int):
        raise OSError("store away")

    dispatcher.load = broken
    offer(session, 1)
    await settle()
    assert door.failures == ["delivery"] and door.writes() == []
    assert session.mailbox.preparing is None
    dispatcher.load = loaded
    offer(session, 1)
    await settle()
    assert door.writes() == [1]
    await session.close()


async def test_a_write_that_outlasts_the_door_s_flush_is_acked_itself(ended):
    """A frame written while the door's flush was under way (deferral on when the write
    began, over when it ended): the flush's ACKs are done, so it is ACKed at once, not
    left in a list nobody reads."""
    session, dispatcher, door = make(acks_on_write=True)
    writing = asyncio.Event()
    finish = asyncio.Event()
    written = door.write_message

    async def slow_write(smuid, payload):
        writing.set()
        await finish.wait()
        return await written(smuid, payload)

    door.write_message = slow_write
    session.defer_acks()
    offer(session, 1)
    await asyncio.wait_for(writing.wait(), scaled(5))
    await session.flush_acks(written=True)  # the door's flush ends meanwhile
    finish.set()
    await settle()
    assert dispatcher.of("ack") == [("ack", 1)]
    await session.close()


async def test_a_backlog_read_before_the_flush_does_not_send_a_written_item_again(ended):
    """Issue 37 (XMPP fan-out items twice on one stream after a reconnect): a stanza (the
    subscribe after the bind) reads the backlog while the pump writes the previous page
    into that stanza's frames, their ACKs deferred to its flush. The store still holds them
    pending (nothing recorded their ACK yet), and so does a wake-up replayed meanwhile:
    neither may send them again. After a flush that failed, they may go again."""
    session, dispatcher, door = make(acks_on_write=True)
    session.defer_acks()
    offer(session, 1, 2)
    await settle()
    assert door.writes() == [1, 2] and dispatcher.of("ack") == []
    dispatcher.backlog_pages.append(([(ACCOUNT, 1, 1), (ACCOUNT, 1, 2), (ACCOUNT, 1, 3)],
                                     False))
    await session.read_backlog()
    offer(session, 2)  # a wake-up that comes late
    await settle()
    assert door.writes() == [1, 2, 3]
    await session.flush_acks(written=True)
    assert dispatcher.of("ack") == [("ack", 1), ("ack", 2), ("ack", 3)]
    session.defer_acks()
    offer(session, 4)
    await settle()
    await session.flush_acks(written=False)  # the frame did not go: not delivered
    offer(session, 4)
    await settle()
    assert door.writes() == [1, 2, 3, 4, 4]


# ------------------------------------------------------------------ the window (profile §9.7)


async def test_a_window_sends_n_and_acks_answer_any_of_them(ended):
    session, dispatcher, door = make()
    assert session.set_window(3) is False  # nothing waits yet
    offer(session, 1, 2, 3, 4, 5)
    await settle()
    assert door.writes() == [1, 2, 3]
    assert await session.ack_inflight(2)
    await session.pump_here()
    assert door.writes() == [1, 2, 3, 4]
    assert await session.ack_inflight()  # the oldest: 1
    assert dispatcher.of("ack") == [("ack", 2), ("ack", 1)]
    with pytest.raises(ServiceError) as refused:
        await session.ack_inflight(2)  # answered already
    assert refused.value.code == 409
    await session.pump_here()
    assert door.writes() == [1, 2, 3, 4, 5]
    assert session.mailbox.in_flight == [3, 4, 5]
    await session.close()


async def test_each_message_of_the_window_is_retried_on_its_own_timer(ended):
    """Retry timeout 0, max retries 1: 7 is ACKed at once, 8 goes twice and is dead; the
    ACK of 7 stopped only 7's timer."""
    session, dispatcher, door = make(DeliveryPolicy(0, 1, queue=False))
    session.set_window(2)
    offer(session, 7, 8)
    await asyncio.wait_for(_until(lambda: door.writes()[:2] == [7, 8]), scaled(5))
    assert await session.ack_inflight(7)
    await asyncio.wait_for(_until(lambda: dispatcher.of("dead")), scaled(5))
    assert dispatcher.of("dead") == [("dead", 8)]
    assert door.writes().count(8) == 2 and door.writes().count(7) == 1
    assert dispatcher.of("ack") == [("ack", 7)]
    await session.close()


async def test_queue_mode_locks_each_message_of_the_window_and_close_releases_them(ended):
    session, dispatcher, _ = make(QUEUE)
    session.set_window(2)
    offer(session, 4, 5, 6)
    await settle()
    assert dispatcher.log[:4] == [("lock", 4), ("write", 4), ("lock", 5), ("write", 5)]
    assert session.mailbox.locks_held == {4, 5}
    assert await session.ack_inflight(5)
    assert dispatcher.of("ack_locked") == [("ack_locked", 5)]
    assert session.mailbox.locks_held == {4}
    await session.pump_here()
    assert session.mailbox.locks_held == {4, 6}
    await session.close()
    assert ("release", None) in dispatcher.log


async def test_a_failed_ack_record_leaves_the_message_waiting_for_its_ack(ended):
    session, dispatcher, _ = make()
    session.set_window(2)
    offer(session, 1, 2)
    await settle()

    async def failing(request, session=None, written=False) -> None:
        raise OSError("store away")

    dispatcher.ack = failing
    with pytest.raises(OSError):
        await session.ack_inflight()
    assert session.mailbox.in_flight == [1, 2] and 1 in session._retry  # timer again
    del dispatcher.ack
    assert await session.ack_inflight()  # the oldest is still 1
    assert dispatcher.of("ack") == [("ack", 1)]
    await session.close()
