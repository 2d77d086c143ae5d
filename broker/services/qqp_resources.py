"""QQP's rules kept in the store (profile: data items): who an unsigned item is published as,
and the ResourceIDs a publisher's items were stored under, remembered ``SMQP_QQP_DEDUP_DAYS``
for duplicate detection. A ResourceID is claimed in the transaction of the publish batch
that stores its item (:func:`claim_in_batch`, called by :mod:`.publish`): the item and its
claim commit together or not at all."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from accounts.models import Account
from broker.models import QQPResource
from broker.store import resources


def _retained_since():
    return timezone.now() - timedelta(days=settings.SMQP_QQP_DEDUP_DAYS)


def unsigned_allowed(address: str) -> bool:
    """Whether an unsigned item from ``address`` may be published (as
    ``SMQP_QQP_UNSIGNED_ACCOUNT``): on one of ``SMQP_QQP_UNSIGNED_FROM``'s networks."""
    if not settings.SMQP_QQP_UNSIGNED_ACCOUNT:
        return False
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    for entry in settings.SMQP_QQP_UNSIGNED_FROM.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry == "loopback":
            if peer.is_loopback:
                return True
            continue
        try:
            if peer in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def unsigned_refusal(address: str) -> str | None:
    """Why an unsigned item from ``address`` is refused, naming the setting that decides;
    None if it may be published (as :func:`unsigned_account_id`)."""
    if not settings.SMQP_QQP_UNSIGNED_ACCOUNT:
        return ("unsigned items are not accepted (SMQP_QQP_UNSIGNED_ACCOUNT is not set; "
                "sign the item)")
    if not unsigned_allowed(address):
        return ("unsigned items are not accepted from this address (not on "
                "SMQP_QQP_UNSIGNED_FROM; sign the item)")
    return None


def unsigned_account_id() -> int | None:
    """The id of the account unsigned items are published as, or None (no such account)."""
    name = settings.SMQP_QQP_UNSIGNED_ACCOUNT
    if not name:
        return None
    found = Account.objects.filter(username_key=name.casefold(), is_active=True).values_list(
        "pk", flat=True).first()
    return found


@dataclass
class Redundant:
    """A publish's result when its ResourceID was stored before for the publisher, within
    the retention (QQP status 1): nothing was stored; ``smuid`` is the earlier message."""

    smuid: int


def send_claim(keys: list[resources.Key], now: datetime) -> Callable[[], set[resources.Key]]:
    """Claim ResourceIDs (distinct (account, ResourceID) keys) inside the transaction of the
    publish batch that stores their items; the returned function reads which were claimed
    (on PostgreSQL the claim is only sent: read it with the batch's other reads, one round
    trip). Then :func:`claim_in_batch`."""
    return resources.claim(keys, now)


def claim_in_batch(keys: list[resources.Key], now: datetime,
                   sent: Callable[[], set[resources.Key]] | None = None
                   ) -> tuple[set[resources.Key], dict[resources.Key, int]]:
    """Claim ResourceIDs (as :func:`send_claim` does, unless ``sent`` is its claim of
    ``keys``): (the keys claimed, whose items are to be published, then :func:`record`-ed or
    :func:`unclaim`-ed in the same transaction; the ones stored before, with their smuids).

    The claim and the message commit together, so a claim without an smuid is never seen
    committed by this code; one found (written by the door before the claim moved into the
    batch, committed ahead of its publish) is settled by the message itself."""
    claimed = (sent or send_claim(keys, now))()
    stored_before: dict[resources.Key, int] = {}
    others = [key for key in keys if key not in claimed]
    retained = now - timedelta(days=settings.SMQP_QQP_DEDUP_DAYS)
    found = resources.held(others)
    for key in others:
        smuid, received = found.get(key, (None, None))
        if key not in found:
            # Deleted since the claim met it (forget_old): claim it anew.
            claimed |= resources.claim([key], now)()
            if key not in claimed:
                raise RuntimeError(f"ResourceID {key[1]!r} neither claimed nor found")
        elif received is None or received < retained:
            claimed.add(key)  # forgotten: a new item (its row is taken over)
        elif smuid is not None or (smuid := resources.stored_message(*key)) is not None:
            stored_before[key] = smuid
        else:
            claimed.add(key)
    return claimed, stored_before


def record(stored: list[tuple[resources.Key, int]], now: datetime) -> None:
    """The claimed ResourceIDs' items were stored (in this transaction) as these smuids."""
    resources.record(stored, now)


def unclaim(keys: list[resources.Key]) -> None:
    """The claimed ResourceIDs' items were refused after all (in this transaction)."""
    resources.drop(keys)


def forget_old() -> int:
    """Remove the ResourceIDs past their retention; how many."""
    deleted, _ = QQPResource.objects.filter(received__lt=_retained_since()).delete()
    return deleted
