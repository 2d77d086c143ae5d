"""How a UAL question is decided (draft §2.2 and §6).

Walk from the topic up to the root. At each level, the entries that match the account and the
right are looked at: an account entry or a remote-server entry naming it, a group it belongs
to, or everyone. The nearest level that has any matching entry decides, and at that level a
deny beats an allow. With no entry anywhere the answer is deny, except that an account may
always subscribe to its own account topic. Superusers may do everything. A virtual topic is
decided as the real topic it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q

from .models import Effect, PrincipalKind, Right, UALEntry

if TYPE_CHECKING:
    from accounts.models import Account
    from topics.models import Topic


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    entry: UALEntry | None = None
    level: Topic | None = None


def _principal_filter(account: Account) -> Q:
    match = Q(principal_kind=PrincipalKind.EVERYONE)
    match |= Q(principal_kind=PrincipalKind.ACCOUNT, account_id=account.pk)
    if account.is_remote_server:
        match |= Q(principal_kind=PrincipalKind.SERVER, account_id=account.pk)
    group_ids = list(account.groups.values_list("pk", flat=True))
    if group_ids:
        match |= Q(principal_kind=PrincipalKind.GROUP, group_id__in=group_ids)
    return match


def decide(account: Account, topic: Topic, right: str) -> Decision:
    """The decision and what made it, for enforcement and for the admin's explanations."""
    if right not in Right.values:
        raise ValueError(f"unknown right {right!r}")
    if not account.is_active:
        return Decision(False, "the account is disabled")
    if account.is_superuser:
        return Decision(True, "superuser")
    topic = topic.resolved()
    if right == Right.SUBSCRIBE and topic.account_id == account.pk:
        return Decision(True, "an account may always subscribe to its own account topic")
    chain = [topic, *topic.ancestors()]
    entries = list(
        UALEntry.objects.filter(
            _principal_filter(account), topic__in=[t.pk for t in chain], right=right
        ).select_related("topic", "account", "group")
    )
    by_level: dict[int, list[UALEntry]] = {}
    for entry in entries:
        by_level.setdefault(entry.topic_id, []).append(entry)
    for level in chain:
        found = by_level.get(level.pk)
        if not found:
            continue
        denies = [e for e in found if e.effect == Effect.DENY]
        if denies:
            return Decision(False, f"denied by {denies[0]}", denies[0], level)
        return Decision(True, f"allowed by {found[0]}", found[0], level)
    return Decision(False, "no entry on the topic or above it: the root default is deny")
