"""QQP's rules kept in the store (profile: data items): who an unsigned item is published as,
and the ResourceIDs a publisher's items were stored under, remembered ``SMQP_QQP_DEDUP_DAYS``
for duplicate detection."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Account
from broker.models import Message, QQPResource


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


#: What :func:`claim` answers when another sender's item with the ResourceID is being published.
BUSY = -1
#: A claim older than this without an smuid was left by a publish that never finished.
STALE_CLAIM = timedelta(seconds=60)


def claim(account_id: int, resource_id: str) -> int | None:
    """Claim the ResourceID before its item is published: None when claimed (publish it),
    the smuid it was stored as within the retention (a duplicate), or :data:`BUSY`."""
    now = timezone.now()
    try:
        with transaction.atomic():
            QQPResource.objects.create(account_id=account_id, resource_id=resource_id,
                                       smuid=None, received=now)
        return None
    except IntegrityError:
        pass
    with transaction.atomic():
        row = QQPResource.objects.select_for_update().filter(
            account_id=account_id, resource_id=resource_id).first()
        if row is None:  # released meanwhile: the other sender's publish failed
            return BUSY
        if row.received < _retained_since():
            row.smuid, row.received = None, now  # forgotten: this is a new item
        elif row.smuid is not None:
            return row.smuid
        elif now - row.received < STALE_CLAIM:
            return BUSY
        else:
            # A claim left by a publish that never said how it ended (the listener stopped,
            # the store went away after the commit): the message itself tells.
            smuid = Message.objects.filter(
                publisher_id=account_id, cmuid=resource_id).values_list("pk", flat=True).first()
            if smuid is not None:
                row.smuid = smuid
                row.save(update_fields=["smuid"])
                return smuid
            row.received = now
        row.save(update_fields=["smuid", "received"])
        return None


def stored(account_id: int, resource_id: str, smuid: int) -> None:
    """The claimed ResourceID's item was stored as ``smuid``."""
    QQPResource.objects.filter(account_id=account_id, resource_id=resource_id).update(
        smuid=smuid)


def release(account_id: int, resource_id: str) -> None:
    """The claimed ResourceID's item was not stored: the claim goes."""
    QQPResource.objects.filter(account_id=account_id, resource_id=resource_id,
                               smuid=None).delete()


def forget_old() -> int:
    """Remove the ResourceIDs past their retention; how many."""
    deleted, _ = QQPResource.objects.filter(received__lt=_retained_since()).delete()
    return deleted
