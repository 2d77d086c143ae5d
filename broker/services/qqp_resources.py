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
from broker.models import QQPResource


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


def unsigned_account_id() -> int | None:
    """The id of the account unsigned items are published as, or None (no such account)."""
    name = settings.SMQP_QQP_UNSIGNED_ACCOUNT
    if not name:
        return None
    found = Account.objects.filter(username_key=name.casefold(), is_active=True).values_list(
        "pk", flat=True).first()
    return found


def stored_smuid(account_id: int, resource_id: str) -> int | None:
    """The smuid an item of this publisher with this ResourceID was stored as, within the
    retention; None when there is none."""
    return QQPResource.objects.filter(
        account_id=account_id, resource_id=resource_id, received__gte=_retained_since(),
    ).values_list("smuid", flat=True).first()


def remember(account_id: int, resource_id: str, smuid: int) -> None:
    """Record a stored item's ResourceID (a row past its retention is taken over)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            QQPResource.objects.create(account_id=account_id, resource_id=resource_id,
                                       smuid=smuid, received=now)
    except IntegrityError:
        QQPResource.objects.filter(account_id=account_id, resource_id=resource_id).update(
            smuid=smuid, received=now)


def forget_old() -> int:
    """Remove the ResourceIDs past their retention; how many."""
    deleted, _ = QQPResource.objects.filter(received__lt=_retained_since()).delete()
    return deleted
