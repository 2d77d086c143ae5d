"""How a UAL question is decided (draft §2.2 and §6).

Walk from the topic up to the root. At each level, the entries that match the account and the
right are looked at: an account entry or a remote-server entry naming it, a group it belongs
to, or everyone. The nearest level that has any matching entry decides, and at that level a
deny beats an allow. With no entry anywhere the answer is deny, except that an account may
always subscribe to its own account topic. Superusers may do everything. A virtual topic is
decided as the real topic it stands for.

The levels of a topic are the prefixes of its case-folded path, so one query loads every entry
that can concern an account (an :class:`AccessSnapshot`) and any number of topics are then
decided in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q

from .models import Effect, PrincipalKind, Right, UALEntry

if TYPE_CHECKING:
    from accounts.models import Account
    from topics.models import Topic

# Rights that make a topic visible to an account in LIST, FIND and COUNT.
VISIBILITY_RIGHTS = (Right.SUBSCRIBE, Right.PUBLISH, Right.MANAGE)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    entry_id: int | None = None
    level: str | None = None  # case-folded path of the deciding level

    @property
    def entry(self) -> UALEntry | None:
        return UALEntry.objects.filter(pk=self.entry_id).first() if self.entry_id else None


def _principal_filter(account: Account) -> Q:
    match = Q(principal_kind=PrincipalKind.EVERYONE)
    match |= Q(principal_kind=PrincipalKind.ACCOUNT, account_id=account.pk)
    if account.is_remote_server:
        match |= Q(principal_kind=PrincipalKind.SERVER, account_id=account.pk)
    group_ids = list(account.groups.values_list("pk", flat=True))
    if group_ids:
        match |= Q(principal_kind=PrincipalKind.GROUP, group_id__in=group_ids)
    return match


def level_keys(key: str) -> list[str]:
    """``/a/b/c`` → ``['/a/b/c', '/a/b', '/a']`` (nearest first)."""
    levels = []
    while key:
        levels.append(key)
        key = key.rpartition("/")[0]
    return levels


class AccessSnapshot:
    """Every UAL entry that concerns one account, loaded once, decided in memory."""

    def __init__(self, account: Account) -> None:
        self.account = account
        self.superuser = account.is_superuser and account.is_active
        # (level key, right) -> [(effect, entry id, label)]
        self.table: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
        if account.is_active and not self.superuser:
            rows = UALEntry.objects.filter(_principal_filter(account)).values_list(
                "topic__key", "right", "effect", "pk", "principal_kind"
            )
            for key, right, effect, pk, kind in rows:
                self.table.setdefault((key, right), []).append((effect, pk, kind))
        self._allowed_keys: set[str] | None = None

    def decide(self, topic: Topic, right: str) -> Decision:
        if right not in Right.values:
            raise ValueError(f"unknown right {right!r}")
        account = self.account
        if not account.is_active:
            return Decision(False, "the account is disabled")
        if self.superuser:
            return Decision(True, "superuser")
        real = topic.resolved()
        if right == Right.SUBSCRIBE and real.account_id == account.pk:
            return Decision(True, "an account may always subscribe to its own account topic")
        for level in level_keys(real.key):
            found = self.table.get((level, right))
            if not found:
                continue
            for effect, pk, kind in found:
                if effect == Effect.DENY:
                    return Decision(False, f"denied to {kind} at {level}", pk, level)
            effect, pk, kind = found[0]
            return Decision(True, f"allowed to {kind} at {level}", pk, level)
        return Decision(False, "no entry on the topic or above it: the root default is deny")

    def allows(self, topic: Topic, right: str) -> bool:
        return self.decide(topic, right).allowed

    def can_see(self, topic: Topic) -> bool:
        """A topic is visible when any right is allowed on it, or an allow entry for this
        account exists below it (so the path down to it can be browsed)."""
        if self.superuser:
            return True
        if any(self.allows(topic, right) for right in VISIBILITY_RIGHTS):
            return True
        if self._allowed_keys is None:
            self._allowed_keys = {
                key for (key, _), found in self.table.items()
                if any(effect == Effect.ALLOW for effect, _, _ in found)
            }
            if self.account.is_active:
                self._allowed_keys.add(f"/accounts/{self.account.username}".casefold())
        for candidate in (topic.key, topic.resolved().key):
            prefix = candidate + "/"
            if any(k.startswith(prefix) for k in self._allowed_keys):
                return True
        return False


def decide(account: Account, topic: Topic, right: str) -> Decision:
    """The decision and what made it, for enforcement and for the admin's explanations."""
    return AccessSnapshot(account).decide(topic, right)
