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

Snapshots are cached per process (:func:`snapshot_for`). Every change that can alter a decision
(a UAL entry, an account's flags or groups, a topic's name or link: see :mod:`ual.signals`)
bumps a "UAL generation" counter kept in the shared Django cache (Redis) once its transaction
has committed. Each process reads that counter at most every :data:`GENERATION_POLL_SECONDS`
and drops all its snapshots when it has changed, so a change reaches every process within
about half a second, and the publish path asks the database nothing per message.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from broker import generations

from .models import Effect, PrincipalKind, Right, UALEntry

if TYPE_CHECKING:
    from accounts.models import Account
    from topics.models import Topic

# Rights that make a topic visible to an account in LIST, FIND and COUNT (``remote``: what
# a peer server may receive, profile §9.5, it must be able to name).
VISIBILITY_RIGHTS = (Right.SUBSCRIBE, Right.PUBLISH, Right.MANAGE, Right.REMOTE)


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
        # (topic id, topic key, right) -> allowed: a snapshot never changes (any change that
        # could alter a decision, a topic's name or link included, replaces the snapshot).
        self._memo: dict[tuple[int | None, str, str], bool] = {}

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
        key = (topic.pk, topic.key, right)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.decide(topic, right).allowed
        return found

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


    def matching(self, level: str, right: str) -> list[tuple[str, int, str]]:
        """The (effect, entry id, principal kind) of the entries at ``level`` (a case-folded
        topic key) that concern this account for ``right``."""
        return list(self.table.get((level, right), ()))


# ------------------------------------------------------------------------ per-process cache

logger = logging.getLogger("ual")

GENERATION_KEY = "ual:generation"
# How often a process asks the shared cache whether anything changed. A change is seen
# everywhere at most this long (plus one round trip) after its transaction committed.
GENERATION_POLL_SECONDS = settings.SMQP_CACHE_POLL_SECONDS

# The clock is a module attribute so that tests can drive the poll interval.
_clock: Callable[[], float] = time.monotonic


class _SnapshotCache:
    """This process's snapshots, keyed by account id, valid for one generation.

    Services run in worker threads (asgiref's thread-sensitive executor, Celery, Daphne's
    sync views), so every read and write of the table holds the lock. Snapshots are built
    outside the lock: a database query never blocks other threads' cache hits.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.snapshots: dict[int, AccessSnapshot] = {}
        # The generation the snapshots belong to; None: not known (not read yet, or the
        # shared cache is unreachable, in which case nothing is cached).
        self.generation: int | None = None
        self.checked_at = float("-inf")
        # Counts local invalidations, so that a snapshot built while one happened is not
        # stored (it may have read the database before the change).
        self.epoch = 0
        self._unknown = 0

    def poll(self) -> int:
        """The current generation, read from the shared cache at most every poll interval;
        drops every snapshot when it changed."""
        now = _clock()
        with self.lock:
            if now - self.checked_at < GENERATION_POLL_SECONDS and self.generation is not None:
                return self.generation
        try:
            seen = _read_generation()
        except Exception:  # the shared cache is down: decide from the database every time
            logger.warning("UAL generation unreadable; access snapshots are not cached",
                           exc_info=True)
            with self.lock:
                self._drop()
                self.generation = None
                self.checked_at = now
                self._unknown += 1
                return -self._unknown
        with self.lock:
            if seen != self.generation:
                self._drop()
                self.generation = seen
            self.checked_at = now
            return seen

    def get(self, account_id: int, stale: Account | None = None) -> AccessSnapshot:
        """The snapshot of the account with id ``account_id``; on a miss it is built from
        the account as stored (``stale``, if given, stands in for a deleted account)."""
        generation = self.poll()
        with self.lock:
            found = self.snapshots.get(account_id)
            if found is not None and self.generation == generation:
                return found
            epoch = self.epoch
        snapshot = AccessSnapshot(_fresh_account(account_id, stale))
        if _sees_uncommitted_change():
            return snapshot  # it may hold what a rollback undoes: use it, do not keep it
        with self.lock:
            if self.epoch == epoch and self.generation == generation:
                snapshot = self.snapshots.setdefault(account_id, snapshot)
        return snapshot

    def recheck(self) -> bool:
        """Read the generation now, whatever the poll interval: True when it changed (the
        snapshots are dropped)."""
        with self.lock:
            known = self.generation
            self.checked_at = float("-inf")
        return self.poll() != known

    def invalidate(self) -> None:
        """Forget every snapshot now and read the generation again on the next use."""
        with self.lock:
            self._drop()
            self.checked_at = float("-inf")

    def _drop(self) -> None:
        self.snapshots.clear()
        self.epoch += 1


def _read_generation() -> int:
    return generations.read(GENERATION_KEY)


_DIRTY = "ual_changed_in_transaction"


def _sees_uncommitted_change() -> bool:
    """Has this thread's connection changed access data in the transaction still open?"""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        setattr(connection, _DIRTY, False)
        return False
    return getattr(connection, _DIRTY, False)


def _fresh_account(account_id: int, stale: Account | None) -> Account:
    """The account as stored now (its flags may have changed since the caller loaded it).
    A deleted account is decided as a disabled one."""
    from accounts.models import Account

    fresh = Account.objects.filter(pk=account_id).first()
    if fresh is None:
        fresh = copy.copy(stale) if stale is not None else Account(pk=account_id)
        fresh.is_active = False
    return fresh


_cache = _SnapshotCache()


def snapshot_for(account: Account) -> AccessSnapshot:
    """The cached :class:`AccessSnapshot` of ``account`` for the current UAL generation.

    Built from the account as stored (not the possibly stale object passed in) on the first
    use after any change; shared by every thread of the process; never mutated by callers.
    """
    return _cache.get(account.pk, account)


def snapshot_for_id(account_id: int) -> AccessSnapshot:
    """:func:`snapshot_for` by account id: no query at all while the snapshot is cached (the
    publish path knows only the publisher's id)."""
    return _cache.get(account_id)


def current_generation() -> int:
    """The UAL generation this process works with (read from the shared cache at most every
    :data:`GENERATION_POLL_SECONDS`). A decision remembered together with the generation it
    was made in stays valid while this returns the same number. While the shared cache is
    unreachable every call returns a new (negative) number, so nothing is remembered."""
    return _cache.poll()


def recheck() -> bool:
    """Read the shared generation now (not a poll interval later): True when UAL decisions
    may have changed elsewhere since this process's snapshots were made (they are dropped).
    For a refusal: checked before it is given, it holds even for a right granted a moment
    ago in another process."""
    return _cache.recheck()


def local_epoch() -> int:
    """Counts the times this process dropped its snapshots (a storage process follows it:
    :mod:`broker.store.lanes`)."""
    return _cache.epoch


def invalidate_local() -> None:
    """Drop this process's snapshots at once (other processes follow on the generation)."""
    _cache.invalidate()


def bump_generation() -> None:
    """Tell every process that UAL decisions may have changed: increment the shared
    generation and drop this process's snapshots. Call it after the change committed (see
    :func:`changed`)."""
    try:
        generations.bump(GENERATION_KEY)
    except Exception:
        logger.exception("could not bump the UAL generation; other processes may decide "
                         "from stale access lists for a while")
    _cache.invalidate()


def changed(using: str | None = None) -> None:
    """Something that decides access changed in the current transaction: drop this
    process's snapshots now and, once the transaction commits, every process's."""
    _cache.invalidate()
    connection = transaction.get_connection(using)
    if connection.in_atomic_block:
        setattr(connection, _DIRTY, True)

    def committed() -> None:
        setattr(connection, _DIRTY, False)
        bump_generation()

    transaction.on_commit(committed, using=using)


def decide(account: Account, topic: Topic, right: str) -> Decision:
    """The decision and what made it, for enforcement and for the admin's explanations
    (from the account's cached snapshot)."""
    return snapshot_for(account).decide(topic, right)
