"""Changing an account's UAL entries: the one place the admin's bulk grant and
``manage.py grant`` do it.

Entries are created, changed and deleted one row at a time (never with a bulk
``update()``/``delete()``), so every change sends the signals that audit it and invalidate the
cached access snapshots of every process (:mod:`ual.signals`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import transaction

from .models import PrincipalKind, UALEntry

if TYPE_CHECKING:
    from accounts.models import Account
    from topics.models import Topic


def principal_kind(account: Account) -> str:
    """A remote-server account is named by a remote-server entry, any other by an account
    entry."""
    return PrincipalKind.SERVER if account.is_remote_server else PrincipalKind.ACCOUNT


@dataclass
class GrantResult:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def grant_to_many(topic: Topic, right: str, effect: str, accounts: list[Account]) -> GrantResult:
    """Give each account one entry for ``right`` on ``topic`` with ``effect``: a new entry,
    or its existing one changed to ``effect``."""
    result = GrantResult()
    with transaction.atomic():
        for account in accounts:
            kind = principal_kind(account)
            name = account.get_username()
            entry = UALEntry.objects.filter(topic=topic, principal_kind=kind, account=account,
                                            right=right).first()
            if entry is None:
                UALEntry.objects.create(topic=topic, principal_kind=kind, account=account,
                                        right=right, effect=effect)
                result.created.append(name)
            elif entry.effect != effect:
                entry.effect = effect
                entry.save(update_fields=["effect"])
                result.changed.append(name)
            else:
                result.unchanged.append(name)
    return result


def revoke(topic: Topic, right: str, account: Account) -> int:
    """Remove the account's entry for ``right`` on ``topic`` (allow or deny); how many went."""
    entries = list(UALEntry.objects.filter(topic=topic, principal_kind=principal_kind(account),
                                           account=account, right=right))
    for entry in entries:
        entry.delete()
    return len(entries)
