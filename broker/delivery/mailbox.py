"""What one subscriber session has to deliver: a plain object, no I/O, no clock.

Each subscriber session (:class:`~broker.delivery.session.SubscriberSession`, at every door)
keeps one :class:`Mailbox` and drives it: the dispatcher offers messages into it, the
session's pump takes the next one, loads and checks it, has the door write it in its own wire
form and reports what happened (sent, ACKed, given up). Times are passed in (the event-loop
clock), so every rule here can be tested without a socket, a database or a loop.

One message at a time is in flight (sent, its ACK awaited); the others wait in a heap ordered
by (priority, smuid): lower priority first, then FIFO, since smuids grow in commit order.

Queue mode (profile §9.6): the door locks a message in the store before it sends it, and
keeps the lock here (:meth:`Mailbox.lock`). At the lock's deadline the message is not sent
again to this session: the lock ends and the message goes to the next subscriber. The
in-flight slot stays taken (the *lost* message) until the client answers it: with SMQP's
``310 ACK``, which names no message, a NOTIFY sent meanwhile would make that answer
ambiguous.

The waiting heap holds one page of the store's backlog at most. Once more is waiting for the
account than that (a subscriber slower than its publishers, or a long backlog), the
(priority, smuid) of the last one held is the *horizon*: offers beyond it are not kept (they
are in the store) and the next page is read once the heap is empty (:data:`NEED_PAGE`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, Final

# take_next(): nothing is held in memory, but the store holds more (read the next page).
NEED_PAGE: Final = "need page"
# retry_due(): send the message in flight again / stop trying (its retries are spent).
RETRY: Final = "retry"
GIVE_UP: Final = "give up"
# retry_due(), queue mode: the lock of the message in flight ended at its deadline (the door
# releases it in the store); the in-flight slot stays taken until the client's answer.
LOCK_ENDED: Final = "lock ended"


class Mailbox:
    """One session's delivery state. ``payload`` is whatever the door sends for a message
    (the dispatcher's (topic path, Cmuid header, message)); the mailbox only keeps it."""

    __slots__ = ("_horizon", "_live", "_locks", "_max_retries", "_paged_in_pass", "_queued",
                 "_skip", "_unrecorded", "_waiting", "_withdrawn", "attempts", "inflight",
                 "inflight_locked", "inflight_payload", "page_size", "preparing",
                 "retry_deadline")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._waiting: list[tuple[int, int]] = []  # heap of (priority, smuid)
        self._queued: set[int] = set()  # smuids in _waiting
        self._skip: set[int] = set()  # in _waiting, but ACKed by another session: not to send
        # In _skip because the store moved it to another account (queue mode): if it comes
        # back to this account (offered again), it goes after all.
        self._withdrawn: set[int] = set()
        # In _waiting because its commit was announced while this session was live (not
        # read from the store): it goes here even if another session of the account ACKs
        # it first (profile §8: every live session gets live messages).
        self._live: set[int] = set()
        # Set while the store holds more waiting messages than are held here: the
        # (priority, smuid) of the last one held. Messages after it come with the next page.
        self._horizon: tuple[int, int] | None = None
        # This pass of the door's pump read a page and has sent nothing since (see take_next).
        self._paged_in_pass = False
        self.inflight: int | None = None  # sent, its ACK awaited
        self.inflight_payload: Any = None
        self.inflight_locked = False  # the message in flight went under a queue-mode lock
        # Taken from the heap, being loaded and checked by the door: not in flight yet, but
        # the same message offered meanwhile is not queued again (it would go twice).
        self.preparing: int | None = None
        self.attempts = 0  # times the message in flight was sent
        self.retry_deadline: float | None = None  # when it is sent again without an ACK
        self._max_retries = 0
        self._locks: dict[int, float] = {}  # smuid → lock deadline (queue mode)
        # Written is delivered (XMPP): written, its ACK held back until the door's flush.
        # The store still has it pending meanwhile, so a backlog read or a late wake-up
        # offers it again: refused until the ACK is recorded (issue 37).
        self._unrecorded: set[int] = set()

    # ------------------------------------------------------------------ offers

    def offer(self, priority: int, smuid: int, *, live: bool = False) -> bool:
        """A message for this session's account. True when it was queued and nothing is in
        flight: the door should start its pump (unless it runs already). ``live``: offered
        at its commit (not read from the store), see :meth:`forget`."""
        if smuid in self._queued:
            if live and smuid not in self._skip:
                self._live.add(smuid)
            if smuid in self._withdrawn:  # moved away, and back to this account since
                self._withdrawn.discard(smuid)
                self._skip.discard(smuid)
                return self.inflight is None
            return False
        if smuid in self._unrecorded:
            return False  # delivered here already (see delivered())
        if smuid == self.preparing or (smuid == self.inflight and not self.lock_lost):
            # (A lost message may come back to this account: queued for after its answer.)
            return False
        if self._horizon is None and len(self._waiting) >= self.page_size:
            # A subscriber slower than its publishers: hold a page in memory, no more. The
            # rest is in the store and is read page by page, in order, once these are sent.
            self._horizon = max(self._waiting)
        if self._horizon is not None and (priority, smuid) > self._horizon:
            return False  # stored, and comes with the next page of the backlog
        heapq.heappush(self._waiting, (priority, smuid))
        self._queued.add(smuid)
        if live:
            self._live.add(smuid)
        return self.inflight is None

    def page(self, rows: Sequence[tuple[int, int, int]], full: bool) -> bool:
        """A page of the store's backlog for this session's account: (account, priority,
        smuid) rows in (priority, smuid) order, as :meth:`Dispatcher.backlog` gives them;
        ``full``: the store holds more after them. Each is offered; True as for
        :meth:`offer` (when any was queued)."""
        self._horizon = (rows[-1][1], rows[-1][2]) if full and rows else None
        kick = False
        for _, priority, smuid in rows:
            if self.offer(priority, smuid):
                kick = True
        return kick

    def forget(self, smuid: int, *, live_too: bool = False) -> None:
        """Another session of the account ACKed it: do not send it here any more, unless it
        came live (offered at its commit while this session was live: every live session
        gets live messages) and ``live_too`` is False (a fan-out ACK; a queue message's ACK
        consumes it for everyone). One already on its way (preparing, in flight) still
        goes, and is ACKed here as well."""
        if smuid in self._queued and (live_too or smuid not in self._live):
            self._skip.add(smuid)

    def withdraw(self, smuid: int) -> None:
        """Queue mode: the store moved the message to another account: do not try to send it
        here (its lock would fail), unless it is offered here again (it came back)."""
        if smuid in self._queued:
            self._skip.add(smuid)
            self._withdrawn.add(smuid)

    @property
    def idle(self) -> bool:
        """Nothing in flight, nothing waiting here or in the store beyond a page (the
        dispatcher's backlog sweep offers the store's backlog to idle sessions)."""
        return self.inflight is None and not self._waiting and self._horizon is None

    @property
    def ready(self) -> bool:
        """Nothing in flight, and something to send (held, or a page to read)."""
        return self.inflight is None and (bool(self._waiting) or self._horizon is not None)

    # ------------------------------------------------------------------ sending

    def begin_pass(self) -> None:
        """The door's pump starts a pass (it takes messages until one is in flight, or none
        is left): a page read before it (at login, at SUBSCRIBE) does not end paging."""
        self._paged_in_pass = False

    def take_next(self) -> int | str | None:
        """The next message to send (it is then *preparing*: the door loads and checks it,
        and calls :meth:`send` or :meth:`done_preparing`); :data:`NEED_PAGE` when the door
        should read the next page of the backlog (and hand it to :meth:`page`); None when
        there is nothing to send. A page of which nothing could be sent in this pass
        (withdrawn, say) ends paging: reading it again would loop; the dispatcher's sweep
        offers what is left later."""
        waiting = self._waiting
        while waiting:
            _, smuid = heapq.heappop(waiting)
            self._queued.discard(smuid)
            self._live.discard(smuid)
            if smuid in self._skip:
                self._skip.discard(smuid)
                self._withdrawn.discard(smuid)
                continue
            self.preparing = smuid
            return smuid
        if self._horizon is None:
            return None
        if self._paged_in_pass:
            self._horizon = None
            return None
        self._paged_in_pass = True
        return NEED_PAGE

    def done_preparing(self) -> None:
        """The message taken does not go (gone, no longer deliverable, or its load failed)."""
        self.preparing = None

    def send(self, smuid: int, payload: Any, *, locked: bool = False) -> None:
        """The message taken goes: in flight from now, no attempt made yet. ``locked``: in
        queue mode, under the lock the door took (:meth:`lock`)."""
        self.preparing = None
        self.inflight, self.inflight_payload, self.attempts = smuid, payload, 0
        self.inflight_locked = locked
        self.retry_deadline = None
        self._paged_in_pass = False

    def attempt(self) -> tuple[int, Any] | None:
        """The door writes the message in flight (again): (smuid, payload), the attempt
        counted (an ACK that comes while it is written counts it); None when nothing is in
        flight (ACKed in the meantime)."""
        if self.inflight is None:
            return None
        self.attempts += 1
        return self.inflight, self.inflight_payload

    def sent(self, smuid: int, now: float, retry_timeout: float, max_retries: int) -> float | None:
        """The attempt is written, at ``now``; the topic's retry policy applies. The deadline
        for its ACK, after which :meth:`retry_due` decides; None when the message is no
        longer in flight (ACKed while it was written)."""
        if self.inflight != smuid:
            return None
        self.retry_deadline = now + retry_timeout
        self._max_retries = max_retries
        return self.retry_deadline

    def retry_due(self, smuid: int) -> str | None:
        """``smuid``'s retry deadline has passed (the door's timer for it went off): :data:`RETRY`
        (send it again), :data:`GIVE_UP` (its retries are spent), :data:`LOCK_ENDED` (queue
        mode: release its lock, :meth:`unlock`), or None when it is no longer in flight (or
        its lock ended already). Times are not compared: the door's timer is the clock (an
        event loop may run a timer a clock tick before its time)."""
        if self.inflight != smuid:
            return None
        if self.inflight_locked:
            return LOCK_ENDED if smuid in self._locks else None
        return GIVE_UP if self.attempts > self._max_retries else RETRY

    def gave_up(self, smuid: int) -> None:
        """The message's retries are spent and it is recorded dead: no longer in flight."""
        if self.inflight == smuid:
            self.inflight = self.inflight_payload = self.retry_deadline = None
            self.inflight_locked = False

    def acked(self, smuid: int | None = None) -> None:
        """The ACK of the message in flight (``smuid``, when the door read it before awaiting
        the record) is recorded (or, queue mode, refused): nothing is in flight. If another
        message went in flight meanwhile (the first gave up while its ACK was being recorded),
        that one stays. Its lock, if any, stays until the door unlocks it."""
        if smuid is not None and self.inflight != smuid:
            return
        self.inflight = self.inflight_payload = self.retry_deadline = None
        self.inflight_locked = False

    def delivered(self, smuid: int) -> None:
        """Written-is-delivered doors: ``smuid`` was written, and its ACK waits (for the
        door's flush): not to be queued again until :meth:`recorded`."""
        self._unrecorded.add(smuid)

    def recorded(self, smuids: Sequence[int]) -> None:
        """The ACKs of these delivered messages are recorded (the dispatcher leaves them out
        of backlog reads and wake-ups from now on), or were never made (the flush failed:
        they were not delivered, and may go again)."""
        self._unrecorded.difference_update(smuids)

    @property
    def lock_lost(self) -> bool:
        """Queue mode: the message in flight went under a lock that has ended (its deadline
        passed): the client's answer to it is refused, and nothing else is sent before."""
        return self.inflight_locked and self.inflight not in self._locks

    # ------------------------------------------------------------------ queue-mode locks

    def lock(self, smuid: int, deadline: float) -> None:
        """This session holds ``smuid`` (queue mode) until ``deadline`` (or a new lock)."""
        self._locks[smuid] = deadline

    def unlock(self, smuid: int) -> bool:
        """The lock on ``smuid`` ends (ACKed, released); False when it was not held."""
        return self._locks.pop(smuid, None) is not None

    def holds(self, smuid: int) -> bool:
        return smuid in self._locks

    @property
    def unacked(self) -> int:
        """Messages sent and not ACKed: the one in flight and the queue-mode locks held (the
        one in flight is usually one of them)."""
        held = len(self._locks)
        if self.inflight is not None and self.inflight not in self._locks:
            held += 1
        return held

    @property
    def locks_held(self) -> frozenset[int]:
        return frozenset(self._locks)

    def expired_locks(self, now: float) -> list[int]:
        """Locks whose deadline is ``now`` or earlier, earliest first (still held: the door
        unlocks each once the store has released it)."""
        expired = [(deadline, smuid) for smuid, deadline in self._locks.items()
                   if deadline <= now]
        expired.sort()
        return [smuid for _, smuid in expired]

    @property
    def next_lock_deadline(self) -> float | None:
        """When the first lock held expires (for the door's timer); None without locks."""
        return min(self._locks.values()) if self._locks else None
