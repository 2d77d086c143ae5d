"""ACK (profile §8): the delivery is done for that account, the message's timeout starts once
every subscriber is done with it, and a receipt goes to its publisher at the first ACK when
asked for. Dead deliveries (retries spent, right revoked) finish a message the same way.

Two forms: :func:`ack`, one ACK in a transaction of its own (what a REST view calls), and
:func:`ack_batch`, what the listener's ACK batches (journaled ACKs, in its storage process)
call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import Account
from broker.domain import message as codec
from broker.domain.values import format_datetime, parse_bool
from broker.models import DataSection, Delivery, Message, UsageEvent
from broker.store import messages as stored
from broker.store.rows import hot_transaction, lock_topics, reads_before_writing
from topics.models import Topic
from ual.resolution import snapshot_for_id

from . import notify
from .deliveries import NO_PRIORITY, effective, selected, start_timeouts, subscribers
from .publish import Published
from .selectors import view_of_message


@dataclass
class AckRequest:
    account_id: int
    smuid: int
    attempts: int = 1
    # False when the message is known not to ask for a receipt (:func:`may_want_receipt`):
    # the ACK then needs nothing read back before its COMMIT.
    receipt: bool = True
    #: The door of the session that ACKed (``broker.store.journal.DOORS``), for the reports.
    door: str = "smqp"


def may_want_receipt(message: codec.Message) -> bool:
    """Might a first ACK of this (stored) message owe its publisher a receipt? Its
    ``Receipt`` header, read as the publish read it (an unreadable one: maybe)."""
    try:
        return parse_bool(message.get("Receipt") or "NO")
    except ValueError:
        return True


def ack(request: AckRequest) -> list[Published]:
    """One ACK in a transaction of its own; the receipts it sent, which the subscriber
    sessions of every process are told of once committed."""
    receipts = ack_batch([request])
    notify.messages_committed_on_commit(receipts)
    return receipts


def ack_batch(acks: list[AckRequest]) -> list[Published]:
    """Record ACKs in one transaction: the deliveries become ACKed (once per account, ever);
    messages whose every publish-time subscriber has now ACKed start their timeout; a
    receipt goes to the publisher at the first ACK when asked for. Returns the receipts,
    for the caller to offer once this has returned (committed). A handful of statements per
    batch; on PostgreSQL one round trip when no message of the batch asks for a receipt,
    else two: this runs once per NOTIFY round trip."""
    # An ACK recorded in a listener's journal reaches this later, and is applied until it
    # commits: one of an account deleted since (its deliveries went with it) is moot, and
    # must not fail its batch again and again.
    names: dict[int, str] = {}
    with reads_before_writing():
        for account_id in {ack.account_id for ack in acks}:
            with contextlib.suppress(Account.DoesNotExist):
                names[account_id] = snapshot_for_id(account_id).account.username
    acks = [ack for ack in acks if ack.account_id in names]
    if not acks:
        return []
    now = timezone.now()
    smuids = sorted({ack.smuid for ack in acks})
    kind = UsageEvent.Kind.ACK.value
    events = stored.event_rows(
        [(kind, names[a.account_id], "", a.smuid, 0, "", {"door": a.door}) for a in acks], now)
    wanted = any(ack.receipt for ack in acks)
    receipts: list[Published] = []
    with hot_transaction(relaxed=settings.SMQP_ACK_DURABILITY != "full"):
        firsts = stored.record_acks(acks, now, returning=wanted)
        stored.finish_messages(smuids, now)
        if firsts is not None:
            newly = firsts()
            receipts = send_receipts(newly, now) if newly else []
        stored.EVENTS.insert(events)
    return receipts


def finish_messages(message_ids: list[int], now: datetime) -> None:
    """Messages with no delivery still open start their timeout; those with dead
    deliveries and none open go to Trash (for audit) at once."""
    stored.finish_messages(message_ids, now)


def send_receipts(message_ids: list[int], now: datetime) -> list[Published]:
    """Receipt: YES → at the first ACK, a receipt message on the publisher's account topic.
    Returns the receipts stored, to be offered to their subscribers after the commit."""
    wanting = Message.objects.filter(pk__in=message_ids, receipt=True).select_related(
        "publisher", "topic")
    due: list[tuple[Message, Topic]] = []
    for original in wanting:
        acked = Delivery.objects.filter(message=original, state=Delivery.State.ACKED).count()
        if acked != 1 or original.publisher is None:  # only the first ACK sends one
            continue
        target = Topic.objects.filter(account=original.publisher).first()
        if target is not None:
            due.append((original, target))
    # As a publish (see lock_topics), all at once: taken one by one, in no set order, they
    # could deadlock with a subscription locking two of these topics.
    lock_topics([target.pk for _, target in due], exclusive=False)
    return [_receipt(original, target, now) for original, target in due]


def _receipt(original: Message, target: Topic, now: datetime) -> Published:
    """Store the receipt of ``original`` on its publisher's account topic ``target``."""
    host = settings.SMQP_SERVER_CONTEXT
    body = f"delivered {host}/{original.pk} on {original.topic.path}".encode()
    receipt = Message.objects.create(
        topic=target, publisher=None, cmuid=f"receipt-{original.pk}", name="Receipt",
        created=now, received=now, timeout=effective(target)["expiry_timeout"],
        in_reply_to=original, size=len(body),
        headers=[("Created", format_datetime(now)), ("Name", "Receipt"),
                 ("X-Receipt-Smuid", f"{host}/{original.pk}"),
                 ("X-Receipt-Cmuid", original.cmuid)],
    )
    DataSection.objects.create(message=receipt, position=0, content_type="text/plain",
                               content_length=len(body),
                               headers=[["Content-Type", "text/plain"]], body=body)
    # (Every subscription counts, as before, whatever its since-time; a selector chooses.)
    subs = [sub._replace(since=None) for sub in subscribers([target], now)().get(target.pk, [])]
    receivers = sorted(selected(subs, now, lambda: view_of_message(
        receipt, topic=target.path, publisher=None, content_type="text/plain")))
    Delivery.objects.bulk_create([Delivery(account_id=a, message=receipt)
                                  for a in receivers])
    if not receivers:
        start_timeouts([receipt.pk], now)
    return Published(receipt.pk, target.pk, target.path, NO_PRIORITY, receivers)


def mark_dead(pairs: list[tuple[int, int]], reason: str = "max retries") -> None:
    """These (account, smuid) deliveries are dead for that account: they used up their
    retries, or (``reason``) may no longer be delivered."""
    now = timezone.now()
    with transaction.atomic():
        for account_id, smuid in pairs:
            updated = Delivery.objects.filter(account_id=account_id, message_id=smuid).exclude(
                state=Delivery.State.ACKED).update(state=Delivery.State.DEAD, last_attempt=now)
            if not updated and not Delivery.objects.filter(
                    account_id=account_id, message_id=smuid).exists():
                Delivery.objects.create(account_id=account_id, message_id=smuid,
                                        state=Delivery.State.DEAD, last_attempt=now)
        finish_messages(sorted({m for _, m in pairs}), now)
        UsageEvent.objects.bulk_create([
            UsageEvent(kind=UsageEvent.Kind.DEAD, smuid=m,
                       detail={"account_id": a, "reason": reason})
            for a, m in pairs])
