"""A subscriber session's mailbox on its own: no socket, no database, no event loop. The same
rules through the SMQP door are in unit/delivery/test_smqp_session_delivery, and over real
sockets in e2e/smqp/test_messages and e2e/smqp/test_backlog."""

from __future__ import annotations

from broker.delivery.mailbox import GIVE_UP, LOCK_ENDED, NEED_PAGE, RETRY, Mailbox

PAGE = 4


def drain(mailbox: Mailbox) -> list[int | str]:
    """Take every message held, as a pump would, sending each and ACKing it; NEED_PAGE last
    when the mailbox then asks for the next page."""
    out: list[int | str] = []
    while True:
        smuid = mailbox.take_next()
        if smuid is None:
            return out
        if smuid is NEED_PAGE:
            return [*out, NEED_PAGE]
        mailbox.send(smuid, f"payload {smuid}")
        mailbox.acked()
        out.append(smuid)


def rows(*pairs: tuple[int, int]) -> list[tuple[int, int, int]]:
    """A backlog page as the dispatcher gives it: (account, priority, smuid)."""
    return [(42, priority, smuid) for priority, smuid in pairs]


# ------------------------------------------------------------------ order


def test_a_lower_priority_number_goes_first_whatever_came_first():
    mailbox = Mailbox(PAGE)
    mailbox.offer(5, 1)
    mailbox.offer(1, 2)
    mailbox.offer(3, 3)
    assert drain(mailbox) == [2, 3, 1]


def test_within_a_priority_messages_go_in_smuid_order():
    mailbox = Mailbox(100)
    for smuid in (7, 3, 9, 4):
        mailbox.offer(2, smuid)
    mailbox.offer(1, 8)
    assert drain(mailbox) == [8, 3, 4, 7, 9]


def test_an_offer_asks_for_the_pump_only_when_nothing_is_in_flight():
    mailbox = Mailbox(PAGE)
    assert mailbox.offer(1, 1) is True
    assert mailbox.take_next() == 1
    mailbox.send(1, "p1")
    assert mailbox.offer(1, 2) is False  # queued: the ACK of 1 brings it
    assert not mailbox.ready


def test_an_offer_while_one_is_in_flight_is_kept_for_after_its_ack():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 1)
    mailbox.send(mailbox.take_next(), "p1")
    assert mailbox.offer(1, 2) is False
    assert not mailbox.ready and not mailbox.idle
    mailbox.acked()
    assert mailbox.ready
    assert drain(mailbox) == [2]
    assert mailbox.idle and not mailbox.ready


# ------------------------------------------------------------------ duplicates


def test_a_message_already_waiting_is_not_queued_twice():
    mailbox = Mailbox(PAGE)
    assert mailbox.offer(1, 9)
    assert not mailbox.offer(1, 9)
    assert drain(mailbox) == [9]


def test_a_message_in_flight_is_not_queued_again():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    assert not mailbox.offer(1, 9)
    mailbox.acked()
    assert mailbox.take_next() is None and mailbox.idle


def test_a_message_being_prepared_is_not_queued_again():
    """Taken from the heap, its NOTIFY not yet written: its wake-up and a backlog read that
    saw it committed may both offer it meanwhile; it goes once."""
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    assert mailbox.take_next() == 9
    assert mailbox.preparing == 9
    assert not mailbox.offer(1, 9)
    mailbox.send(9, "p9")
    assert mailbox.preparing is None and mailbox.inflight == 9
    mailbox.acked()
    assert mailbox.take_next() is None


def test_a_message_that_did_not_go_may_be_offered_again():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    assert mailbox.take_next() == 9
    mailbox.done_preparing()  # not deliverable (its right was withdrawn, say)
    assert mailbox.preparing is None and mailbox.idle
    assert mailbox.offer(1, 9)
    assert drain(mailbox) == [9]


def test_a_message_skipped_but_not_yet_dropped_is_not_queued_again():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.offer(1, 10)
    mailbox.forget(10)
    assert not mailbox.offer(1, 10)
    assert drain(mailbox) == [9]


# ------------------------------------------------------------------ forget


def test_forget_skips_a_waiting_message_and_leaves_the_others():
    mailbox = Mailbox(PAGE)
    for smuid in (9, 10, 11):
        mailbox.offer(1, smuid)
    mailbox.forget(10)
    assert drain(mailbox) == [9, 11]
    assert not mailbox._skip and not mailbox._queued


def test_forget_does_not_stop_a_message_already_on_its_way():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.offer(1, 10)
    assert mailbox.take_next() == 9
    mailbox.forget(9)  # preparing: still goes
    mailbox.send(9, "p9")
    mailbox.forget(9)  # in flight: still awaits its ACK
    assert mailbox.inflight == 9
    mailbox.acked()
    assert drain(mailbox) == [10]


def test_a_live_message_still_goes_when_another_session_acked_it():
    """Issue 34, item 9 (profile §8): every live session gets live messages."""
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9, live=True)
    mailbox.offer(1, 10)  # from the store (a backlog page)
    mailbox.forget(9)
    mailbox.forget(10)
    assert drain(mailbox) == [9]
    assert not mailbox._live and not mailbox._skip


def test_a_live_queue_message_consumed_elsewhere_is_skipped():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9, live=True)
    mailbox.offer(1, 10, live=True)
    mailbox.forget(9, live_too=True)
    assert drain(mailbox) == [10]
    assert not mailbox._live


def test_a_backlog_message_offered_live_again_is_live():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    assert not mailbox.offer(1, 9, live=True)  # queued once
    mailbox.forget(9)
    assert drain(mailbox) == [9]


def test_forget_of_a_message_never_offered_is_nothing():
    mailbox = Mailbox(PAGE)
    mailbox.forget(9)
    assert mailbox.offer(1, 9)
    assert drain(mailbox) == [9]


# ------------------------------------------------------------------ paging


def test_a_page_is_held_and_offers_beyond_it_are_left_to_the_store():
    mailbox = Mailbox(PAGE)
    for smuid in range(1, PAGE + 1):
        assert mailbox.offer(1, smuid)
    # The page is full: the last held becomes the horizon; later messages stay stored.
    assert not mailbox.offer(1, 5)
    assert not mailbox.offer(2, 6)
    # One that sorts before the horizon (a higher priority) is still held.
    assert mailbox.offer(0, 7)
    assert not mailbox.idle
    assert drain(mailbox) == [7, 1, 2, 3, 4, NEED_PAGE]  # the rest from the store, in order


def test_a_full_backlog_page_sets_the_horizon_and_the_next_page_follows():
    mailbox = Mailbox(PAGE)
    assert mailbox.page(rows((1, 1), (1, 2), (1, 3), (1, 4)), full=True)
    assert not mailbox.offer(1, 5)  # after the page: read with the next one
    assert not mailbox.offer(3, 6)
    assert mailbox.offer(1, 0)  # before the horizon: held
    mailbox.begin_pass()
    assert drain(mailbox) == [0, 1, 2, 3, 4, NEED_PAGE]
    assert mailbox.page(rows((1, 5), (3, 6)), full=False)  # queued, nothing in flight: kick
    assert drain(mailbox) == [5, 6]
    assert mailbox.take_next() is None and mailbox.idle


def test_a_page_that_is_not_full_ends_paging():
    mailbox = Mailbox(PAGE)
    mailbox.page(rows((1, 1), (1, 2)), full=False)
    assert mailbox.offer(9, 100)  # no horizon: a live offer is held
    assert drain(mailbox) == [1, 2, 100]
    assert mailbox.take_next() is None and mailbox.idle


def test_an_empty_page_ends_paging():
    mailbox = Mailbox(2)
    mailbox.page(rows((1, 1), (1, 2)), full=True)
    assert drain(mailbox) == [1, 2, NEED_PAGE]
    assert not mailbox.page(rows(), full=True)  # everything was ACKed meanwhile
    assert mailbox.idle and not mailbox.ready
    assert mailbox.take_next() is None


def test_a_page_of_which_nothing_could_be_sent_ends_paging():
    """Reading it again would give the same page: the pass stops, and the horizon goes (the
    dispatcher's sweep offers what is left later)."""
    mailbox = Mailbox(2)
    mailbox.page(rows((1, 1), (1, 2)), full=True)
    mailbox.begin_pass()
    for _ in range(2):
        mailbox.take_next()
        mailbox.done_preparing()  # not deliverable
    assert mailbox.take_next() is NEED_PAGE  # the login's page does not count
    mailbox.page(rows((1, 3), (1, 4)), full=True)
    for _ in range(2):
        mailbox.take_next()
        mailbox.done_preparing()
    assert mailbox.take_next() is None  # this pass's page gave nothing
    assert mailbox.idle and not mailbox.ready


def test_a_page_from_which_one_went_lets_the_next_page_be_read():
    mailbox = Mailbox(2)
    mailbox.begin_pass()
    mailbox.page(rows((1, 1), (1, 2)), full=True)
    assert mailbox.take_next() == 1
    mailbox.send(1, "p1")  # one of the page went...
    mailbox.acked()
    assert mailbox.take_next() == 2
    mailbox.done_preparing()  # ...and one did not
    assert mailbox.take_next() is NEED_PAGE
    mailbox.page(rows((1, 3), (1, 4)), full=True)
    assert mailbox.take_next() == 3
    mailbox.send(3, "p3")
    mailbox.acked()
    assert mailbox.take_next() == 4
    mailbox.done_preparing()
    assert mailbox.take_next() is NEED_PAGE  # 3 went: the page after it is read too


def test_a_new_pass_may_read_the_page_again():
    """A pass that stopped after reading a page, before taking from it (the door paused,
    say), does not end paging for the next pass."""
    mailbox = Mailbox(2)
    mailbox.page(rows((1, 1), (1, 2)), full=True)
    mailbox.begin_pass()
    assert drain(mailbox) == [1, 2, NEED_PAGE]
    mailbox.page(rows((1, 3), (1, 4)), full=True)  # the pass stops here
    mailbox.begin_pass()
    for _ in range(2):
        mailbox.take_next()
        mailbox.done_preparing()  # not deliverable
    assert mailbox.take_next() is NEED_PAGE  # this pass read no page yet


# ------------------------------------------------------------------ retries


def test_the_retry_deadline_comes_from_the_policy_and_the_time_sent():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    assert mailbox.attempt() == (9, "p9")
    assert mailbox.sent(9, now=100.0, retry_timeout=30, max_retries=2) == 130.0
    assert mailbox.retry_deadline == 130.0


def test_attempts_are_counted_and_the_message_is_given_up_after_max_retries():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    assert mailbox.attempts == 0
    verdicts = []
    now = 0.0
    for _ in range(4):
        smuid, payload = mailbox.attempt()
        assert (smuid, payload) == (9, "p9")
        now = mailbox.sent(9, now, retry_timeout=10, max_retries=2)
        verdicts.append(mailbox.retry_due(9))
        if verdicts[-1] is GIVE_UP:
            break
    # The first send and two retries, then no more.
    assert verdicts == [RETRY, RETRY, GIVE_UP]
    assert mailbox.attempts == 3 and now == 30.0
    mailbox.gave_up(9)
    assert mailbox.inflight is None and mailbox.inflight_payload is None and mailbox.idle


def test_an_attempt_counts_before_it_is_written():
    """An ACK that comes while the NOTIFY is being written records this attempt."""
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    mailbox.attempt()
    assert mailbox.attempts == 1


def test_a_retry_timer_for_a_message_no_longer_in_flight_does_nothing():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.offer(1, 10)
    mailbox.send(mailbox.take_next(), "p9")
    mailbox.attempt()
    mailbox.sent(9, 0.0, 10, 3)
    mailbox.acked()
    assert mailbox.retry_due(9) is None
    assert mailbox.sent(9, 1.0, 10, 3) is None  # ACKed while it was written: no deadline
    assert mailbox.attempt() is None  # a resend decided before the ACK sends nothing
    mailbox.send(mailbox.take_next(), "p10")
    assert mailbox.retry_due(9) is None
    mailbox.gave_up(9)  # a late give-up of 9 leaves 10 in flight
    assert mailbox.inflight == 10


def test_a_new_message_in_flight_starts_counting_again():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.offer(1, 10)
    mailbox.send(mailbox.take_next(), "p9")
    mailbox.attempt()
    mailbox.attempt()
    mailbox.acked()
    mailbox.send(mailbox.take_next(), "p10")
    assert mailbox.attempts == 0 and mailbox.retry_deadline is None


# ------------------------------------------------------------------ ACK


def test_an_ack_clears_what_is_in_flight_and_the_next_may_go():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.offer(1, 10)
    mailbox.send(mailbox.take_next(), ("/t", "c/1", "m"))
    mailbox.attempt()
    mailbox.sent(9, 0.0, 60, 3)
    assert (mailbox.inflight, mailbox.inflight_payload, mailbox.attempts) == (
        9, ("/t", "c/1", "m"), 1)
    assert not mailbox.ready
    mailbox.acked()
    assert mailbox.inflight is None and mailbox.inflight_payload is None
    assert mailbox.retry_deadline is None
    assert mailbox.ready
    assert mailbox.take_next() == 10


# ------------------------------------------------------------------ locks


def test_locks_held_are_listed_and_unlocked():
    mailbox = Mailbox(PAGE)
    assert mailbox.locks_held == frozenset() and mailbox.next_lock_deadline is None
    mailbox.lock(9, 130.0)
    mailbox.lock(10, 120.0)
    assert mailbox.locks_held == {9, 10}
    assert mailbox.holds(9) and not mailbox.holds(11)
    assert mailbox.next_lock_deadline == 120.0
    assert mailbox.unlock(10) is True
    assert mailbox.unlock(10) is False  # no longer held
    assert mailbox.locks_held == {9} and mailbox.next_lock_deadline == 130.0


def test_expired_locks_are_those_past_their_deadline_earliest_first():
    mailbox = Mailbox(PAGE)
    mailbox.lock(9, 130.0)
    mailbox.lock(10, 120.0)
    mailbox.lock(11, 200.0)
    assert mailbox.expired_locks(100.0) == []
    assert mailbox.expired_locks(130.0) == [10, 9]  # a deadline reached counts
    assert mailbox.locks_held == {9, 10, 11}  # still held until the door unlocks them
    for smuid in mailbox.expired_locks(130.0):
        mailbox.unlock(smuid)
    assert mailbox.locks_held == {11}


def test_a_lock_taken_again_gets_the_new_deadline():
    mailbox = Mailbox(PAGE)
    mailbox.lock(9, 100.0)
    mailbox.lock(9, 300.0)
    assert mailbox.expired_locks(200.0) == [] and mailbox.locks_held == {9}


def test_locks_are_apart_from_what_is_in_flight():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    mailbox.lock(9, 50.0)
    mailbox.acked()
    assert mailbox.locks_held == {9}  # the door unlocks it once the store consumed it
    mailbox.unlock(9)
    assert mailbox.locks_held == frozenset()


def test_a_locked_message_past_its_deadline_ends_its_lock_instead_of_going_again():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    smuid = mailbox.take_next()
    mailbox.lock(smuid, 50.0)
    mailbox.send(smuid, "p9", locked=True)
    mailbox.attempt()
    mailbox.sent(9, 10.0, 40, 5)
    assert mailbox.retry_due(9) == LOCK_ENDED and not mailbox.lock_lost
    mailbox.unlock(9)  # released in the store
    assert mailbox.lock_lost and mailbox.retry_due(9) is None
    # Nothing else goes until the client answers the lost one.
    mailbox.offer(1, 10)
    assert not mailbox.ready and mailbox.inflight == 9


def test_a_lost_message_offered_again_waits_for_after_the_answer():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.lock(9, 50.0)
    mailbox.send(mailbox.take_next(), "p9", locked=True)
    assert mailbox.offer(1, 9) is False and not mailbox.ready  # held: not queued twice
    mailbox.unlock(9)
    assert mailbox.offer(1, 9) is False  # its lock ended, it came back to the account
    mailbox.acked()  # the client's answer (409)
    assert not mailbox.inflight_locked
    assert mailbox.take_next() == 9


def test_an_unlocked_message_in_flight_is_retried_as_before():
    mailbox = Mailbox(PAGE)
    mailbox.offer(1, 9)
    mailbox.send(mailbox.take_next(), "p9")
    mailbox.attempt()
    mailbox.sent(9, 10.0, 40, 5)
    assert not mailbox.lock_lost and mailbox.retry_due(9) == RETRY
    assert mailbox.offer(1, 9) is False and not mailbox._waiting


def test_a_withdrawn_message_is_not_tried_unless_it_comes_back():
    mailbox = Mailbox(PAGE)
    for smuid in (9, 10, 11):
        mailbox.offer(1, smuid)
    mailbox.withdraw(10)  # moved to another account
    mailbox.withdraw(11)
    assert mailbox.offer(1, 11) is True  # moved back to this account: it goes after all
    assert drain(mailbox) == [9, 11]
    assert not mailbox._skip and not mailbox._withdrawn and not mailbox._queued


def test_an_ack_recorded_late_leaves_the_next_message_in_flight() -> None:
    # The ACK of 1 is being recorded when 1's retries run out and 2 goes in flight: the ACK's
    # end must not clear 2 (it would lose its retry timer and its own ACK would be refused).
    mailbox = Mailbox(page_size=10)
    mailbox.offer(5, 1)
    mailbox.offer(5, 2)
    assert mailbox.take_next() == 1
    mailbox.send(1, "p1")
    acking = mailbox.inflight
    mailbox.gave_up(1)
    assert mailbox.take_next() == 2
    mailbox.send(2, "p2")
    mailbox.acked(acking)
    assert mailbox.inflight == 2 and mailbox.inflight_payload == "p2"
    mailbox.acked(2)
    assert mailbox.inflight is None


def test_unacked_counts_the_message_in_flight_and_the_locks_held():
    """Issue 36: what the operators' sessions list shows as "unacked"."""
    box = Mailbox(page_size=10)
    assert box.unacked == 0
    box.lock(7, 100.0)
    box.lock(8, 100.0)
    assert box.unacked == 2
    box.send(8, "p8", locked=True)  # in flight under its lock: counted once
    assert box.unacked == 2
    box.acked(8)  # the lock stays until the door unlocks it
    box.send(9, "p9")  # a fan-out message in flight, no lock
    assert box.unacked == 3
    box.unlock(7)
    assert box.unacked == 2


# ------------------------------------------------------------------ the window (profile §9.7)


def fill(mailbox: Mailbox) -> list[int]:
    """Send what the window lets go, as the pump does: the smuids sent."""
    out = []
    while mailbox.has_room:
        smuid = mailbox.take_next()
        if smuid is None or smuid is NEED_PAGE:
            break
        mailbox.send(smuid, f"p{smuid}")
        out.append(smuid)
    return out


def test_a_window_lets_n_go_before_any_ack_and_one_more_per_ack():
    mailbox = Mailbox(100, window=3)
    for smuid in (1, 2, 3, 4, 5):
        assert mailbox.offer(1, smuid)  # room: the pump may send
    assert fill(mailbox) == [1, 2, 3]
    assert mailbox.in_flight == [1, 2, 3] and not mailbox.has_room
    assert not mailbox.ready and not mailbox.idle
    assert mailbox.offer(1, 6) is False  # full: kept for after an ACK
    mailbox.acked(2)
    assert mailbox.ready
    assert fill(mailbox) == [4]
    assert mailbox.in_flight == [1, 3, 4]


def test_the_default_window_is_one():
    mailbox = Mailbox(PAGE)
    for smuid in (1, 2):
        mailbox.offer(1, smuid)
    assert fill(mailbox) == [1]


def test_a_bare_ack_answers_the_oldest_a_named_one_any():
    mailbox = Mailbox(PAGE, window=4)
    for smuid in (5, 6, 7, 8):
        mailbox.offer(1, smuid)
    fill(mailbox)
    mailbox.acked(7)  # out of order
    assert mailbox.in_flight == [5, 6, 8]
    mailbox.acked()  # the oldest
    assert mailbox.in_flight == [6, 8] and mailbox.inflight == 6
    mailbox.acked(99)  # not in flight: nothing
    assert mailbox.in_flight == [6, 8]


def test_the_oldest_is_the_first_sent_whatever_the_priority_of_those_sent_later():
    mailbox = Mailbox(PAGE, window=2)
    mailbox.offer(5, 1)
    assert fill(mailbox) == [1]
    mailbox.offer(1, 2)  # a higher priority, sent after 1
    assert fill(mailbox) == [2]
    assert mailbox.claim_ack() == (1, mailbox.flight(1))


def test_an_ack_claims_its_message_once_until_recorded_or_given_back():
    mailbox = Mailbox(PAGE, window=3)
    for smuid in (1, 2, 3):
        mailbox.offer(1, smuid)
    fill(mailbox)
    first, entry = mailbox.claim_ack()
    assert first == 1 and entry.payload == "p1"
    # While 1's ACK is being recorded, a bare ACK answers the next, a named one not 1.
    assert mailbox.claim_ack()[0] == 2
    assert mailbox.claim_ack(1) is None
    assert mailbox.claim_ack(42) is None  # not in flight here
    mailbox.unclaim_ack(1)  # its record failed: it waits for an ACK again
    assert mailbox.claim_ack(1)[0] == 1
    mailbox.acked(1)
    mailbox.acked(2)
    assert mailbox.claim_ack()[0] == 3
    mailbox.acked(3)
    assert mailbox.claim_ack() is None and mailbox.idle


def test_each_message_in_flight_keeps_its_own_attempts_and_deadline():
    mailbox = Mailbox(PAGE, window=2)
    mailbox.offer(1, 1)
    mailbox.offer(1, 2)
    fill(mailbox)
    mailbox.attempt(1)
    assert mailbox.sent(1, 0.0, retry_timeout=10, max_retries=1) == 10.0
    mailbox.attempt(2)
    assert mailbox.sent(2, 5.0, retry_timeout=30, max_retries=1) == 35.0
    assert mailbox.retry_due(1) is RETRY
    assert mailbox.attempt(1) == (1, "p1")
    mailbox.sent(1, 10.0, 10, 1)
    assert mailbox.retry_due(1) is GIVE_UP  # two attempts of 1, its retries spent ...
    assert mailbox.flight(2).attempts == 1 and mailbox.retry_due(2) is RETRY  # ... not 2's
    assert mailbox.flight(2).retry_deadline == 35.0
    mailbox.gave_up(1)
    assert mailbox.in_flight == [2] and mailbox.has_room


def test_a_retry_keeps_the_message_the_oldest():
    mailbox = Mailbox(PAGE, window=2)
    mailbox.offer(1, 1)
    mailbox.offer(1, 2)
    fill(mailbox)
    mailbox.attempt(1)
    mailbox.attempt(2)
    mailbox.attempt(1)  # written again, after 2
    assert mailbox.in_flight == [1, 2]
    mailbox.acked()
    assert mailbox.in_flight == [2]


def test_a_shrunk_window_sends_nothing_until_below_it():
    mailbox = Mailbox(PAGE, window=3)
    for smuid in (1, 2, 3, 4):
        mailbox.offer(1, smuid)
    fill(mailbox)
    assert mailbox.set_window(1) is False
    mailbox.acked()
    mailbox.acked()
    assert not mailbox.ready  # one still in flight: the window is full
    mailbox.acked()
    assert mailbox.ready and fill(mailbox) == [4]
    assert mailbox.set_window(2) is False  # room, but nothing waits


def test_a_larger_window_asks_for_the_pump_when_something_waits():
    mailbox = Mailbox(PAGE)
    for smuid in (1, 2, 3):
        mailbox.offer(1, smuid)
    assert fill(mailbox) == [1]
    assert mailbox.set_window(3) is True
    assert fill(mailbox) == [2, 3]


def test_a_lost_message_keeps_its_slot_and_the_others_go_on():
    """Queue mode: 1's lock ended; the bare ACK the client may still send for it must not
    answer another, so 1 keeps its slot until answered; the rest of the window is used."""
    mailbox = Mailbox(PAGE, window=2)
    for smuid in (1, 2, 3):
        mailbox.offer(1, smuid)
    mailbox.take_next()
    mailbox.lock(1, 50.0)
    mailbox.send(1, "p1", locked=True)
    mailbox.take_next()
    mailbox.lock(2, 60.0)
    mailbox.send(2, "p2", locked=True)
    mailbox.unlock(1)  # its deadline: released in the store
    assert mailbox.lost(1) and not mailbox.lost(2) and mailbox.lock_lost
    assert not mailbox.ready  # 1 and 2 fill the window
    mailbox.acked(2)
    assert fill(mailbox) == [3]
    assert mailbox.claim_ack()[0] == 1  # the bare ACK still answers the lost one (409)


def test_a_lost_message_that_comes_back_goes_again_only_after_its_answer():
    """One smuid is in flight once at most, even with room in the window."""
    mailbox = Mailbox(PAGE, window=3)
    mailbox.offer(1, 1)
    mailbox.take_next()
    mailbox.lock(1, 50.0)
    mailbox.send(1, "p1", locked=True)
    assert mailbox.offer(1, 1) is False  # held here: not again
    mailbox.unlock(1)
    assert mailbox.offer(1, 1) is False  # back to this account, but not while in flight
    assert mailbox.take_next() is None
    mailbox.acked(1)  # the client's answer (409)
    assert mailbox.take_next() == 1


def test_a_returning_message_consumed_elsewhere_is_not_offered_again():
    mailbox = Mailbox(PAGE, window=2)
    mailbox.offer(1, 1)
    mailbox.take_next()
    mailbox.lock(1, 50.0)
    mailbox.send(1, "p1", locked=True)
    mailbox.unlock(1)
    mailbox.offer(1, 1)
    mailbox.forget(1, live_too=True)  # another session of the account consumed it
    mailbox.acked(1)
    assert mailbox.take_next() is None and mailbox.idle


def test_unacked_counts_every_message_in_flight():
    mailbox = Mailbox(PAGE, window=3)
    for smuid in (1, 2, 3):
        mailbox.offer(1, smuid)
    fill(mailbox)
    mailbox.lock(3, 10.0)
    assert mailbox.unacked == 3
