"""One subscriber session, shared by every door: its :class:`~.mailbox.Mailbox`, the pump that
sends what waits there, the retry and lock timers, backlog reading, queue-mode locks and
their release when the session ends.

The door passes in its wire work (:class:`Door`): write one message, whether it may send now,
its queue credit per queue node, what to tell the client when a lock expires. Two ways of
answering a delivery exist, chosen by :attr:`Door.acks_on_write`:

- the client ACKs (SMQP): up to the session's window of messages (profile §9.7; one by
  default) are in flight, each until its ``310 ACK``; one without an ACK by its topic's retry
  timeout goes again, and after its max retries it is recorded dead. In queue mode each goes
  under a lock of its own whose deadline ends it instead (profile §9.6).
- written is delivered (XMPP, profile §3): a fan-out message is ACKed once its frame was
  written (never before); a queue item leaves the in-flight slot once written and stays
  locked (*held*) until its holder consumes or unlocks it, or its lock expires. Up to the
  door's queue credit of items per queue node are held at once; those over it are parked
  until a lock on that node ends.

The dispatcher sees the session as its ``Session`` protocol (``account_id``, ``mailbox``,
``session``, ``idle``, ``kick()``). :meth:`SubscriberSession.close` is idempotent, and the door
calls it from every end of its transport: the session's locks go back with it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from broker.services import ServiceError, conflict
from broker.services import ack as ack_service
from broker.services import auth as auth_service
from broker.services import pubsub as pubsub_service
from broker.services.deliveries import NO_PRIORITY
from broker.services.read import DeliveryPolicy
from broker.store import dbthread

from .mailbox import GIVE_UP, LOCK_ENDED, NEED_PAGE, RETRY, Mailbox

#: What the dispatcher loads for a message: (topic path, Cmuid header, codec message).
Payload = tuple[str, str, Any]


@dataclass(slots=True)
class Held:
    """A queue item locked to this session after it was written (written-is-delivered doors),
    by the node it came from and its item id."""

    node: str
    item_id: str


class Door(Protocol):
    """A door's wire work, as the session needs it."""

    #: The client's address, for the log.
    peer: str
    #: The door is ending its stream: nothing more is sent.
    closing: bool
    #: True: a message written is delivered (see the module's docstring); False: it waits
    #: for the client's ACK.
    acks_on_write: bool

    def may_send(self) -> bool:
        """May messages go now (SMQP: notifications not suspended; XMPP: presence
        available)?"""
        ...

    def queue_credit(self, topic: str) -> int | None:
        """Items of the queue node ``topic`` this session may hold locked at once: 0 when it
        takes none (not its subscriber), None when the door sets no limit."""
        ...

    async def write_message(self, smuid: int, payload: Payload) -> bool:
        """Write one message in the door's wire form; False when it could not be written."""
        ...

    async def locks_expired(self, held: list[Held]) -> None:
        """These held items' locks reached their deadline and were released (tell the
        client)."""
        ...

    def failed(self, what: str, exc: BaseException | None = None) -> None:
        """Log a failure that ends nothing but itself (the door's one error funnel; ``exc``:
        the failure, else the one being handled)."""
        ...


class SubscriberSession:
    """Everything one subscriber session needs to deliver (see the module's docstring)."""

    def __init__(self, door: Door, page_size: int, *, door_name: str = "smqp",
                 turn: asyncio.Lock | None = None, handle: Any = None) -> None:
        self.door = door
        self.door_name = door_name  # for the ACK's usage event (journal.DOORS)
        # Held while lock expiry changes what is held: the door's one-handler-at-a-time lock.
        self._turn = turn or asyncio.Lock()
        # What the dispatcher knows this session by (registered, named with its ACKs): this
        # object, or the door when the door registers itself and forwards to it.
        self.handle = self if handle is None else handle
        self.mailbox = Mailbox(page_size)
        self.account_id = 0
        self.session: Any = None  # the LoginSession (accounts.models) once logged in
        self.dispatcher: Any = None  # broker.delivery.Dispatcher, set at login
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._pump_task: asyncio.Task | None = None
        self._pumping = False  # _pump() runs (in its task, or inline: pump_here())
        self._tasks: set[asyncio.Task] = set()
        # Retry timers of the messages in flight (client ACKs), by smuid.
        self._retry: dict[int, asyncio.TimerHandle] = {}
        self._lock_timer: asyncio.TimerHandle | None = None
        self._took_locks = False  # a lock was asked for: the session's locks end with it
        # Queue items locked here and not written yet (or written into a frame the door
        # holds for its flush): if the session ends first, their locks give back the
        # attempt they counted, as nobody received them (issue 34 item 1).
        self.unsent: set[int] = set()
        self._unsent_deferred: list[int] = []
        # Written-is-delivered doors: fan-out ACKs waiting for the door's flush (None: ACK
        # at once), queue items held, by smuid and by (node key, item id), and items parked
        # while their node is at its credit.
        self._deferred_acks: list[ack_service.AckRequest] | None = None
        self.held: dict[int, Held] = {}
        self.held_by_id: dict[tuple[str, str], int] = {}
        self.parked: defaultdict[str, set[tuple[int, int]]] = defaultdict(set)

    # ------------------------------------------------------------------ the dispatcher's view

    @property
    def ending(self) -> bool:
        return self.closed or self.door.closing

    @property
    def idle(self) -> bool:
        """Nothing to send and not closing (the dispatcher's backlog sweep asks)."""
        return self.mailbox.idle and not self.ending

    @property
    def pump_busy(self) -> bool:
        return self._pumping or (self._pump_task is not None and not self._pump_task.done())

    def kick(self) -> None:
        """Start the pump if the mailbox has something to send (the dispatcher calls this
        when an offer was queued)."""
        if (self.mailbox.ready and self.session is not None and not self.ending
                and self.door.may_send() and not self.pump_busy):
            self._pump_task = self._spawn(self._pump(), "delivery")

    def register(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        dispatcher.register(self.handle)

    async def pump_here(self) -> None:
        """Send the next messages from here (with the door's answer in one write) rather than
        from a task of the pump's own, unless the pump runs already. Its failure is logged:
        the door's answer still goes, and the backlog sweep offers the message again."""
        if self.pump_busy or self.session is None:
            return
        try:
            await self._pump()
        except Exception:
            self.door.failed("next message")

    def _spawn(self, coro: Coroutine, what: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, what))
        return task

    def _task_done(self, task: asyncio.Task, what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.door.failed(what, task.exception())

    # ------------------------------------------------------------------ the pump

    async def read_backlog(self) -> None:
        """Offer what the store holds for the account, a page at a time (in order)."""
        if self.dispatcher is None:
            return
        await self.dispatcher.caught_up()  # what was ACKed until now is in the store
        rows, full = await self.dispatcher.backlog([self.account_id])
        if self.mailbox.page(rows, full):
            self.kick()

    def set_window(self, window: int) -> bool:
        """Up to ``window`` messages in flight from now (profile §9.7; the services checked
        it against the server's maximum). True when more may go now: the door pumps (with
        its answer, :meth:`pump_here`) or kicks."""
        return self.mailbox.set_window(window)

    async def _pump(self) -> None:
        """Send waiting messages until the window is full (one pump at a time)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            await self._pump_next()
        finally:
            self._pumping = False

    async def _pump_next(self) -> None:
        mailbox, dispatcher = self.mailbox, self.dispatcher
        mailbox.begin_pass()
        while mailbox.has_room and not self.ending and self.door.may_send():
            smuid = mailbox.take_next()
            if smuid is None:
                break
            if smuid is NEED_PAGE:
                await self.read_backlog()
                continue
            try:
                if mailbox.holds(smuid):  # locked here already (offered again)
                    mailbox.done_preparing()
                    continue
                payload = await dispatcher.load(smuid)
                if payload is None or not await dispatcher.deliverable(
                        self.account_id, smuid, payload[0]):
                    mailbox.done_preparing()
                    continue
                policy = await dispatcher.retry_policy(payload[0])
                if policy.queue:
                    credit = self.door.queue_credit(payload[0])
                    if credit == 0:
                        # Not this session's to take (no subscription of its to the queue
                        # node); it is read from the store again when it subscribes.
                        mailbox.done_preparing()
                        continue
                    if credit is not None and self._held_on(payload[0].casefold()) >= credit:
                        mailbox.done_preparing()
                        if not self._park(payload, smuid):
                            break
                        continue
                    if not await self._lock(smuid, policy):
                        mailbox.done_preparing()
                        continue
            except BaseException:
                mailbox.done_preparing()
                raise
            mailbox.send(smuid, payload, locked=policy.queue)
            await self._write_inflight(smuid, policy)

    async def _lock(self, smuid: int, policy: DeliveryPolicy) -> bool:
        """Queue mode: lock the message to this session before it is written (profile §9.6);
        False when it is not this session's to send."""
        if self.session is None:  # ended meanwhile
            return False
        self._took_locks = True
        # Before the await: the pump may be cancelled during it, the lock taken all the same.
        self.unsent.add(smuid)
        if not await self.dispatcher.lock(self.account_id, self.session.guid, smuid, policy):
            self.unsent.discard(smuid)
            return False
        self.mailbox.lock(smuid, self._loop.time() + policy.retry_timeout)
        return True

    async def _write_inflight(self, smuid: int, policy: DeliveryPolicy | None = None) -> None:
        """Write ``smuid``, in flight, (again): ``policy`` is its topic's (read when None)."""
        attempt = self.mailbox.attempt(smuid)
        if attempt is None:  # ACKed since this (re)send was decided
            return
        smuid, payload = attempt
        if policy is None:
            policy = await self.dispatcher.retry_policy(payload[0])
        if self.door.acks_on_write:
            await self._write_delivered(smuid, payload, policy)
            return
        if await self.door.write_message(smuid, payload):
            self.unsent.discard(smuid)
            self._count_out()
        # Written or not (a SET NOTIFY PORT connection gone, say), it goes again at its
        # retry deadline unless its ACK comes.
        deadline = self.mailbox.sent(smuid, self._loop.time(), policy.retry_timeout,
                                     policy.max_retries)
        if deadline is not None:
            self._cancel_retry(smuid)
            self._retry[smuid] = self._loop.call_at(deadline, self._retry_due, smuid)

    def _cancel_retry(self, smuid: int) -> None:
        timer = self._retry.pop(smuid, None)
        if timer is not None:
            timer.cancel()

    async def _write_delivered(self, smuid: int, payload: Payload,
                               policy: DeliveryPolicy) -> None:
        mailbox = self.mailbox
        topic, cmuid, message = payload
        entry = mailbox.flight(smuid)
        attempts = entry.attempts if entry is not None else 1
        if policy.queue:
            # Held before it is written: the holder's answer may come while it is.
            item_id = pubsub_service.item_id_of(cmuid, smuid)
            self.held[smuid] = Held(topic, item_id)
            self.held_by_id[(topic.casefold(), item_id)] = smuid
            if not await self.door.write_message(smuid, payload):
                return  # the stream is ending: its locks go back with it
            if self._deferred_acks is not None:
                self._unsent_deferred.append(smuid)  # written once the flush wrote it
            else:
                self.unsent.discard(smuid)
            self._count_out()
            mailbox.acked(smuid)  # the slot is free; the lock stays until consumed or ended
            self._arm_lock_timer()
            return
        deferred = self._deferred_acks
        if not await self.door.write_message(smuid, payload):
            return  # not written: the stream is ending, and the message stays unACKed
        self._count_out()
        # Profile §3: delivered once written (a frame the door held for its flush: once
        # the flush wrote it, flush_acks(); if that flush is over already, now).
        request = ack_service.AckRequest(self.account_id, smuid, attempts,
                                         ack_service.may_want_receipt(message), self.door_name)
        if deferred is not None and deferred is self._deferred_acks:
            deferred.append(request)
        else:
            await self.dispatcher.ack(request, self.handle, written=True)
        mailbox.acked(smuid)

    def _count_out(self) -> None:
        """One message written (the operators' counters and sessions list)."""
        self.dispatcher.metrics.count("deliver")
        self.dispatcher.metrics.session(self.session.guid if self.session else None, "out")

    def defer_acks(self) -> None:
        """The door holds its writes for a flush from now: a fan-out message written
        meanwhile is ACKed by :meth:`flush_acks`, once the flush wrote it."""
        if self._deferred_acks is None:
            self._deferred_acks = []

    async def flush_acks(self, written: bool) -> None:
        """The door's flush ended: ``written`` when its frames went; if not, the messages
        written meanwhile stay unACKed (they are sent again, never lost)."""
        acks, self._deferred_acks = self._deferred_acks or [], None
        deferred, self._unsent_deferred = self._unsent_deferred, []
        if written:
            self.unsent.difference_update(deferred)
            for request in acks:
                await self.dispatcher.ack(request, self.handle, written=True)

    # ------------------------------------------------------------------ retries (client ACKs)

    def _retry_due(self, smuid: int) -> None:
        """No ACK by the retry deadline: send again, or give up; in queue mode the lock ends
        instead."""
        self._retry.pop(smuid, None)
        if self.ending:
            return
        verdict = self.mailbox.retry_due(smuid)
        if verdict is GIVE_UP:
            self._pump_task = self._spawn(self._give_up(smuid), "giving up")
        elif verdict is RETRY:
            self._pump_task = self._spawn(self._write_inflight(smuid), "retry")
        elif verdict is LOCK_ENDED:
            self._spawn(self._lock_ended(smuid), "lock end")

    async def _give_up(self, smuid: int) -> None:
        await self.dispatcher.dead(self.account_id, smuid)
        self.mailbox.gave_up(smuid)
        await self._pump()

    async def _lock_ended(self, smuid: int) -> None:
        """Queue mode: the lock of a message in flight reached its deadline without an ACK.
        It ends (the message goes to the next subscriber), and its slot in the window stays
        taken until the client answers it: that answer is refused (409)."""
        if self.mailbox.unlock(smuid):
            await self.release([smuid])

    async def ack_inflight(self, smuid: int | None = None) -> bool:
        """The client's ACK of a message in flight (the oldest; ``smuid``: that one),
        recorded (group commit) before the door answers it. False when nothing waited for
        one (a bare ACK); ServiceError 409 when ``smuid`` is not in flight here, and in
        queue mode when its lock was lost (nothing consumed; it is no longer in flight
        afterwards either way)."""
        mailbox = self.mailbox
        claimed = mailbox.claim_ack(smuid)
        if claimed is None:
            if smuid is not None:
                raise conflict(f"no message {smuid} waits for 310 ACK here")
            return False
        target, entry = claimed
        self._cancel_retry(target)
        receipt = entry.payload is None or ack_service.may_want_receipt(entry.payload[2])
        request = ack_service.AckRequest(self.account_id, target, entry.attempts, receipt,
                                         self.door_name)
        if not entry.locked:
            try:
                await self.dispatcher.ack(request, self.handle)
            except BaseException:
                # Not recorded: it waits for an ACK again, and goes again at its deadline.
                mailbox.unclaim_ack(target)
                self._rearm(target)
                raise
            mailbox.acked(target)
            return True
        # Queue mode: it consumes the message only while this session holds its lock, as
        # the store decides (another process may have ended it).
        refusal: ServiceError | None = None
        if not mailbox.unlock(target):  # its deadline passed here: released already
            refusal = conflict("lock not held")
        else:
            try:
                await self.dispatcher.ack_locked(
                    request, self.session.guid if self.session else "", self.handle)
            except ServiceError as exc:
                if exc.code != 409:
                    mailbox.unclaim_ack(target)
                    raise
                refusal = exc
                # Its deadline passed in the store before here (or a sweep ended it): the
                # lock ends now rather than at the next sweep.
                await self.release([target])
            except BaseException:
                mailbox.unclaim_ack(target)
                raise
        mailbox.acked(target)
        if refusal is not None:
            raise refusal
        return True

    def _rearm(self, smuid: int) -> None:
        """The retry timer of ``smuid`` again, at the deadline it had (an ACK that failed)."""
        entry = self.mailbox.flight(smuid)
        if entry is not None and entry.retry_deadline is not None and not self.ending:
            self._cancel_retry(smuid)
            self._retry[smuid] = self._loop.call_at(entry.retry_deadline, self._retry_due,
                                                    smuid)

    # ------------------------------------------------------ held items (written is delivered)

    def _held_on(self, key: str) -> int:
        return sum(1 for h in self.held.values() if h.node.casefold() == key)

    def _park(self, payload: Payload, smuid: int) -> bool:
        """Put aside an item of a node at its credit, until a lock there ends; False when
        too many are put aside already: it waits in the mailbox (the pump stops)."""
        priority = _priority(payload[2])
        if sum(map(len, self.parked.values())) >= self.mailbox.page_size:
            self.mailbox.offer(priority, smuid)
            return False
        self.parked[payload[0].casefold()].add((priority, smuid))
        return True

    def unpark(self, key: str) -> None:
        """The node ``key`` (casefolded) may have credit again: its parked items wait in the
        mailbox again."""
        parked = self.parked.pop(key, None)
        if parked:
            for priority, smuid in sorted(parked):
                self.mailbox.offer(priority, smuid)
            self.kick()

    def drop_held(self, smuids: list[int]) -> None:
        """These items are no longer held here (consumed, unlocked, expired)."""
        for smuid in smuids:
            self.mailbox.unlock(smuid)
            held = self.held.pop(smuid, None)
            if held is not None:
                key = held.node.casefold()
                self.held_by_id.pop((key, held.item_id), None)
                self.unpark(key)
        self._arm_lock_timer()

    async def consume(self, smuid: int) -> None:
        """The holder consumes a held item (XEP-0254's retract): the ACK of its lock, once.
        ServiceError 409 when the lock was no longer this session's (it is released)."""
        self.drop_held([smuid])
        payload = await self.dispatcher.load(smuid)
        receipt = payload is None or ack_service.may_want_receipt(payload[2])
        try:
            await self.dispatcher.ack_locked(
                ack_service.AckRequest(self.account_id, smuid, 1, receipt, self.door_name),
                self.session.guid, self.handle)
        except ServiceError as exc:
            if exc.code == 409:
                await self.release([smuid])
            raise

    async def release(self, smuids: list[int] | None) -> None:
        """The session's locks (on ``smuids``; all when None) end in the store now. Best
        effort: the lock sweep ends what this misses."""
        if self.session is None:  # the session ended: every lock was released with it
            return
        try:
            await self.dispatcher.release(self.account_id, self.session.guid, smuids)
        except Exception:
            self.door.failed("releasing locks")

    async def release_all(self) -> None:
        """Every held item goes back (XEP-0254 §3: the client became unavailable)."""
        if self.held:
            self.drop_held(list(self.held))
        await self.release(None)

    def _arm_lock_timer(self) -> None:
        if self._lock_timer is not None:
            self._lock_timer.cancel()
            self._lock_timer = None
        deadline = self.mailbox.next_lock_deadline
        if deadline is not None and self.held and not self.ending:
            self._lock_timer = self._loop.call_at(deadline, self._locks_due)

    def _locks_due(self) -> None:
        self._lock_timer = None
        self._spawn(self._expire_locks(), "lock expiry")

    async def _expire_locks(self) -> None:
        """Held locks past their deadline end: the items go to the next subscriber (the
        topic's max retries apply) and the door tells its client."""
        async with self._turn:
            if self.ending:
                return
            expired = [m for m in self.mailbox.expired_locks(self._loop.time())
                       if m in self.held]
            told = [self.held[m] for m in expired]
            self.drop_held(expired)
            if expired:
                await self.release(expired)
                await self.door.locks_expired(told)
            self._arm_lock_timer()
            self.kick()

    # ------------------------------------------------------------------ the end

    async def close(self) -> None:
        """The session ends (its transport ended, by whatever path): no more sending, its
        locks go back (they are the store's: the next subscriber gets their messages), and
        its login session ends. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for timer in (*self._retry.values(), self._lock_timer):
            if timer is not None:
                timer.cancel()
        self._retry.clear()
        if self.dispatcher is not None:
            self.dispatcher.unregister(self.handle)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        login, self.session = self.session, None
        if login is None:
            return
        if self._took_locks or self.held:
            try:
                await self.dispatcher.release(self.account_id, login.guid,
                                              unsent=self.unsent)
            except Exception:  # the lock sweep ends them
                self.door.failed(f"releasing the locks of session {login.guid}")
        await _end_login(login)


def _end_login(login: Any) -> Awaitable[None]:
    return dbthread.run(auth_service.end_session, login)


def _priority(message: Any) -> int:
    """The (priority, smuid) order key's priority of a loaded message, as the store ranks
    it (its Priority header; none: after every prioritised one)."""
    try:
        return int(message.get("Priority") or NO_PRIORITY)
    except ValueError:
        return NO_PRIORITY
