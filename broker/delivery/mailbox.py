"""What one subscriber session has to deliver: a plain object, no I/O, no clock.

Each subscriber session (:class:`~broker.delivery.session.SubscriberSession`, at every door)
keeps one :class:`Mailbox` and drives it: the dispatcher offers messages into it, the
session's pump takes the next one, loads and checks it, has the door write it in its own wire
form and reports what happened (sent, ACKed, given up). Times are passed in (the event-loop
clock), so every rule here can be tested without a socket, a database or a loop.

Up to :attr:`Mailbox.window` messages are in flight (sent, their ACK awaited; profile §9.7,
one unless the session asked for more), each with its own attempts and retry deadline; the
others wait in a heap ordered by (priority, smuid): lower priority first, then FIFO, since
smuids grow in commit order. In flight, they are kept in the order they were first sent: a
bare ``310 ACK`` answers the oldest, ``310 ACK <smuid>`` the one it names.

Queue mode (profile §9.6): the door locks a message in the store before it sends it, and
keeps the lock here (:meth:`Mailbox.lock`). At the lock's deadline the message is not sent
again to this session: the lock ends and the message goes to the next subscriber. Its
in-flight slot stays taken (the *lost* message) until the client answers it: a bare
``310 ACK`` names no message, and freeing the slot would let that answer take the next one.

The waiting heap holds one page of the store's backlog at most. Once more is waiting for the
account than that (a subscriber slower than its publishers, or a long backlog), the
(priority, smuid) of the last one held is the *horizon*: offers beyond it are not kept (they
are in the store) and the next page is read once the heap is empty (:data:`NEED_PAGE`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

# take_next(): nothing is held in memory, but the store holds more (read the next page).
NEED_PAGE: Final = "need page"
# retry_due(): send the message in flight again / stop trying (its retries are spent).
RETRY: Final = "retry"
GIVE_UP: Final = "give up"
# retry_due(), queue mode: the lock of the message in flight ended at its deadline (the door
# releases it in the store); its in-flight slot stays taken until the client's answer.
LOCK_ENDED: Final = "lock ended"


@dataclass(slots=True)
class InFlight:
    """One message sent and not answered yet: what the door writes for it (``payload``),
    whether it went under a queue-mode lock, the times it was written and when its ACK is
    due (the topic's retry policy, as of its last attempt)."""

    payload: Any
    locked: bool = False
    attempts: int = 0
    retry_deadline: float | None = None
    max_retries: int = 0


class Mailbox:
    """One session's delivery state. ``payload`` is whatever the door sends for a message
    (the dispatcher's (topic path, Cmuid header, message)); the mailbox only keeps it."""

    __slots__ = ("_acking", "_flight", "_horizon", "_live", "_locks", "_paged_in_pass",
                 "_queued", "_returning", "_skip", "_waiting", "_withdrawn", "page_size",
                 "preparing", "window")

    def __init__(self, page_size: int, window: int = 1) -> None:
        self.page_size = page_size
        # Messages that may be in flight at once (profile §9.7; 1 is the draft's behaviour).
        self.window = window
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
        # Sent, their ACK awaited, oldest first (a dict keeps the order of first sending).
        self._flight: dict[int, InFlight] = {}
        # In flight and their ACK being recorded: another ACK does not name them again.
        self._acking: set[int] = set()
        # Lost messages (in flight, their lock ended) offered again to this account: they
        # wait for the client's answer to the lost one (smuid → priority).
        self._returning: dict[int, int] = {}
        # Taken from the heap, being loaded and checked by the door: not in flight yet, but
        # the same message offered meanwhile is not queued again (it would go twice).
        self.preparing: int | None = None
        self._locks: dict[int, float] = {}  # smuid → lock deadline (queue mode)

    # ------------------------------------------------------------------ offers

    def offer(self, priority: int, smuid: int, *, live: bool = False) -> bool:
        """A message for this session's account. True when it was queued and the window has
        room: the door should start its pump (unless it runs already). ``live``: offered at
        its commit (not read from the store), see :meth:`forget`."""
        if smuid in self._queued:
            if live and smuid not in self._skip:
                self._live.add(smuid)
            if smuid in self._withdrawn:  # moved away, and back to this account since
                self._withdrawn.discard(smuid)
                self._skip.discard(smuid)
                return self.has_room
            return False
        if smuid == self.preparing:
            return False
        if smuid in self._flight:
            if self.lost(smuid):
                # Its lock ended and it came back to this account: it goes again once the
                # client has answered the lost one (one smuid is in flight once at most).
                self._returning[smuid] = priority
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
        return self.has_room

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
        if live_too:
            self._returning.pop(smuid, None)

    def withdraw(self, smuid: int) -> None:
        """Queue mode: the store moved the message to another account: do not try to send it
        here (its lock would fail), unless it is offered here again (it came back)."""
        if smuid in self._queued:
            self._skip.add(smuid)
            self._withdrawn.add(smuid)
        self._returning.pop(smuid, None)

    @property
    def idle(self) -> bool:
        """Nothing in flight, nothing waiting here or in the store beyond a page (the
        dispatcher's backlog sweep offers the store's backlog to idle sessions)."""
        return not self._flight and not self._waiting and self._horizon is None

    @property
    def has_room(self) -> bool:
        """Fewer messages in flight than the window: another may go."""
        return len(self._flight) < self.window

    @property
    def ready(self) -> bool:
        """Room in the window, and something to send (held, or a page to read)."""
        return self.has_room and (bool(self._waiting) or self._horizon is not None)

    def set_window(self, window: int) -> bool:
        """The session's window is now ``window`` (≥ 1; checked by the services): True when
        there is room and something to send (kick the pump). Shrunk below what is in flight,
        nothing more goes until enough of those are answered."""
        self.window = window
        return self.ready

    # ------------------------------------------------------------------ sending

    def begin_pass(self) -> None:
        """The door's pump starts a pass (it takes messages until the window is full, or none
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
        """The message taken goes: in flight from now (the newest), no attempt made yet.
        ``locked``: in queue mode, under the lock the door took (:meth:`lock`)."""
        self.preparing = None
        self._flight[smuid] = InFlight(payload, locked)
        self._paged_in_pass = False

    def flight(self, smuid: int | None = None) -> InFlight | None:
        """The state of ``smuid`` in flight (the oldest when None); None when not in flight."""
        if smuid is None:
            return next(iter(self._flight.values()), None)
        return self._flight.get(smuid)

    @property
    def in_flight(self) -> list[int]:
        """The messages in flight, oldest first."""
        return list(self._flight)

    def attempt(self, smuid: int | None = None) -> tuple[int, Any] | None:
        """The door writes ``smuid`` (the oldest in flight when None) (again): (smuid,
        payload), the attempt counted (an ACK that comes while it is written counts it);
        None when it is not in flight (ACKed in the meantime)."""
        if smuid is None:
            smuid = self.inflight
            if smuid is None:
                return None
        entry = self._flight.get(smuid)
        if entry is None:
            return None
        entry.attempts += 1
        return smuid, entry.payload

    def sent(self, smuid: int, now: float, retry_timeout: float, max_retries: int) -> float | None:
        """The attempt is written, at ``now``; the topic's retry policy applies. The deadline
        for its ACK, after which :meth:`retry_due` decides; None when the message is no
        longer in flight (ACKed while it was written)."""
        entry = self._flight.get(smuid)
        if entry is None:
            return None
        entry.retry_deadline = now + retry_timeout
        entry.max_retries = max_retries
        return entry.retry_deadline

    def retry_due(self, smuid: int) -> str | None:
        """``smuid``'s retry deadline has passed (the door's timer for it went off): :data:`RETRY`
        (send it again), :data:`GIVE_UP` (its retries are spent), :data:`LOCK_ENDED` (queue
        mode: release its lock, :meth:`unlock`), or None when it is no longer in flight (or
        its lock ended already). Times are not compared: the door's timer is the clock (an
        event loop may run a timer a clock tick before its time)."""
        entry = self._flight.get(smuid)
        if entry is None:
            return None
        if entry.locked:
            return LOCK_ENDED if smuid in self._locks else None
        return GIVE_UP if entry.attempts > entry.max_retries else RETRY

    def gave_up(self, smuid: int) -> None:
        """The message's retries are spent and it is recorded dead: no longer in flight."""
        self._answered(smuid)

    def claim_ack(self, smuid: int | None = None) -> tuple[int, InFlight] | None:
        """The message a client's ACK answers, with its state: the oldest in flight
        (``smuid`` None) or ``smuid``, if in flight and not being recorded for an earlier
        ACK already; None when there is none. Until :meth:`acked` (or :meth:`unclaim_ack` if
        its record fails) no other ACK answers it."""
        if smuid is None:
            smuid = next((m for m in self._flight if m not in self._acking), None)
        entry = self._flight.get(smuid) if smuid is not None else None
        if smuid is None or entry is None or smuid in self._acking:
            return None
        self._acking.add(smuid)
        return smuid, entry

    def unclaim_ack(self, smuid: int) -> None:
        """The ACK claimed could not be recorded: the message waits for an ACK again."""
        self._acking.discard(smuid)

    def acked(self, smuid: int | None = None) -> None:
        """The ACK of ``smuid`` (the oldest in flight when None) is recorded (or, queue mode,
        refused): it is no longer in flight. Nothing when it is not in flight (it gave up
        while its ACK was being recorded, and another went in flight since). Its lock, if
        any, stays until the door unlocks it."""
        if smuid is None:
            smuid = self.inflight
            if smuid is None:
                return
        self._answered(smuid)

    def _answered(self, smuid: int) -> None:
        if self._flight.pop(smuid, None) is None:
            return
        self._acking.discard(smuid)
        priority = self._returning.pop(smuid, None)
        if priority is not None:  # a lost one that came back: it may go again now
            self.offer(priority, smuid)

    def lost(self, smuid: int) -> bool:
        """Queue mode: ``smuid`` went under a lock that has ended (its deadline passed): the
        client's answer to it is refused, and its slot stays taken until then."""
        entry = self._flight.get(smuid)
        return entry is not None and entry.locked and smuid not in self._locks

    # ------------------------------------------------------- the oldest in flight (window 1)

    @property
    def inflight(self) -> int | None:
        """The oldest message in flight (with a window of one, the one); None when none."""
        return next(iter(self._flight), None)

    @property
    def inflight_payload(self) -> Any:
        entry = self.flight()
        return None if entry is None else entry.payload

    @property
    def inflight_locked(self) -> bool:
        entry = self.flight()
        return entry is not None and entry.locked

    @property
    def attempts(self) -> int:
        entry = self.flight()
        return 0 if entry is None else entry.attempts

    @property
    def retry_deadline(self) -> float | None:
        entry = self.flight()
        return None if entry is None else entry.retry_deadline

    @property
    def lock_lost(self) -> bool:
        """The oldest message in flight is :meth:`lost`."""
        smuid = self.inflight
        return smuid is not None and self.lost(smuid)

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
        """Messages sent and not ACKed: those in flight and the queue-mode locks held (one in
        flight is usually one of them)."""
        return len(self._locks) + sum(1 for m in self._flight if m not in self._locks)

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
