"""The per-process cache of access snapshots and its invalidation in every process (issue 5,
part 2): a change bumps the shared UAL generation after commit; a process polls it at most every
0.5 s; a revoke is seen within a second; the cache is safe to share between threads."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.db import connection, transaction

from accounts.models import Account
from tests.support.factories import make_account
from tests.support.timing import scaled
from topics.models import Topic
from ual import check, resolution
from ual.models import UALEntry
from ual.resolution import (
    AccessSnapshot,
    current_generation,
    invalidate_local,
    snapshot_for,
    snapshot_for_id,
)

# Committed data and real on_commit callbacks: the cache only keeps what was committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def own_generation_key(monkeypatch):
    """A generation counter of this test's own, so parallel test runs cannot disturb it, and
    a cache that starts empty."""
    monkeypatch.setattr(resolution, "GENERATION_KEY", f"ual:generation:test:{uuid.uuid4().hex}")
    invalidate_local()
    yield
    cache.delete(resolution.GENERATION_KEY)
    invalidate_local()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(resolution, "_clock", fake)
    return fake


def stored_generation() -> int | None:
    return cache.get(resolution.GENERATION_KEY)


def other_process_changes(topic: Topic, account: Account, right: str, effect: str) -> None:
    """What another process's change looks like from here: new rows (no signal reaches this
    process) and a bumped shared generation."""
    UALEntry.objects.bulk_create([UALEntry(topic=topic, principal_kind="account",
                                           account=account, right=right, effect=effect)])
    cache.incr(resolution.GENERATION_KEY)


def test_snapshots_are_cached_per_account_and_built_from_the_stored_account():
    bob = make_account("bob")
    first = snapshot_for(bob)
    assert snapshot_for(bob) is first
    assert snapshot_for(Account.objects.get(pk=bob.pk)) is first
    alice = make_account("alice")
    assert snapshot_for(alice) is not snapshot_for(bob)
    # A stale account object does not matter: the snapshot reads the account as stored.
    Account.objects.filter(pk=bob.pk).update(is_superuser=True)
    invalidate_local()
    stale = Account.objects.get(pk=bob.pk)
    stale.is_superuser = False
    snap = snapshot_for(stale)
    assert snap.superuser and snap.account.is_superuser
    # The uncached snapshot still works as before.
    assert AccessSnapshot(stale).superuser is False


def test_cached_decisions_ask_the_database_nothing(django_assert_num_queries):
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    UALEntry.objects.create(topic=t, principal_kind="everyone", right="publish")
    snap = snapshot_for_id(bob.pk)
    with django_assert_num_queries(0):
        for _ in range(1000):  # a thousand publishes' permission checks
            assert snapshot_for_id(bob.pk).allows(t, "publish")
        assert snapshot_for(bob) is snap
        assert check(bob, t, "publish")
    gone = snapshot_for_id(bob.pk + 1000)
    assert not gone.account.is_active and not gone.allows(t, "publish")


def test_a_ual_change_here_invalidates_at_once_and_bumps_the_shared_generation():
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    before = current_generation()
    assert not check(bob, t, "publish")
    cached = snapshot_for(bob)
    entry = UALEntry.objects.create(topic=t, principal_kind="account", account=bob,
                                    right="publish")
    assert stored_generation() == before + 1
    assert snapshot_for(bob) is not cached
    assert check(bob, t, "publish")
    entry.effect = "deny"
    entry.save()
    assert not check(bob, t, "publish")
    entry.delete()
    assert stored_generation() == before + 3
    assert not check(bob, t, "publish")


def test_a_change_in_another_process_is_seen_at_the_next_poll(clock):
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    assert not check(bob, t, "subscribe")
    cached = snapshot_for(bob)
    other_process_changes(t, bob, "subscribe", "allow")
    clock.now += 0.4  # inside the poll interval: the generation is not read again
    assert snapshot_for(bob) is cached and not check(bob, t, "subscribe")
    clock.now += 0.11  # 0.51 s since the last poll
    assert check(bob, t, "subscribe")
    assert snapshot_for(bob) is not cached


def test_a_revoke_elsewhere_takes_effect_within_one_second():
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    UALEntry.objects.create(topic=t, principal_kind="account", account=bob, right="subscribe")
    assert check(bob, t, "subscribe")
    # Revoked by "another process": the row goes without a signal here; the counter moves.
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {UALEntry._meta.db_table} WHERE account_id = %s", [bob.pk])
    cache.incr(resolution.GENERATION_KEY)
    revoked_at = time.monotonic()
    while check(bob, t, "subscribe"):
        assert time.monotonic() - revoked_at < scaled(1.0), \
            "still allowed a second after the revoke"
        time.sleep(0.01)
    # (The poll interval is the process's own; the margin over it scales with a busy machine.)
    assert time.monotonic() - revoked_at <= resolution.GENERATION_POLL_SECONDS + scaled(0.2)


def test_the_generation_is_read_at_most_every_half_second(clock, monkeypatch):
    reads = []
    real_get = cache.get
    monkeypatch.setattr(cache, "get",
                        lambda key, *a, **kw: (reads.append(key), real_get(key, *a, **kw))[1])
    first = current_generation()
    for _ in range(100):
        assert current_generation() == first
    assert len(reads) == 2  # the first read, and the one after creating the counter
    clock.now += 0.49
    current_generation()
    assert len(reads) == 2
    clock.now += 0.01
    current_generation()
    assert len(reads) == 3


def test_changes_that_matter_bump_and_others_do_not():
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    start = current_generation()

    def bumped(action) -> bool:
        before = stored_generation()
        action()
        return stored_generation() != before

    assert not bumped(lambda: bob.save(update_fields=["last_login"]))
    assert not bumped(lambda: bob.save())  # nothing that matters changed
    bob.proper_name = "Bob B."
    assert not bumped(bob.save)
    bob.is_active = False
    assert bumped(bob.save)
    bob.is_superuser = True
    assert bumped(lambda: bob.save(update_fields=["is_superuser"]))
    bob.is_remote_server = True
    assert bumped(bob.save)
    traders = Group.objects.create(name="traders")
    assert bumped(lambda: bob.groups.add(traders))
    assert bumped(lambda: traders.user_set.remove(bob))
    assert bumped(lambda: bob.groups.add(traders))
    assert bumped(traders.delete)
    assert bumped(lambda: Topic.objects.create(path="/t/child", parent=t))
    t.max_retries = 3
    assert not bumped(t.save)  # a queue parameter decides nothing about access
    t.path = "/renamed"
    assert bumped(t.save)
    other = Topic.objects.create(path="/other")
    t.link = other
    assert bumped(lambda: t.save(update_fields=["link"]))
    assert bumped(Topic.objects.get(path="/t/child").delete)
    assert bumped(lambda: make_account("carol"))
    assert bumped(Account.objects.get(username="carol").delete)
    assert stored_generation() > start


def test_nothing_is_bumped_or_kept_from_a_rolled_back_change():
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    before = current_generation()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        UALEntry.objects.create(topic=t, principal_kind="account", account=bob,
                                right="manage")
        assert check(bob, t, "manage")  # inside the transaction the change is visible
        raise Undo
    assert stored_generation() == before
    assert not check(bob, t, "manage")


def test_a_deleted_account_is_decided_as_disabled():
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")
    UALEntry.objects.create(topic=t, principal_kind="everyone", right="publish")
    assert check(bob, t, "publish")
    Account.objects.filter(pk=bob.pk).delete()
    assert not check(bob, t, "publish")


def test_without_the_shared_cache_nothing_is_cached(monkeypatch):
    bob = make_account("bob")
    t = Topic.objects.create(path="/t")

    def down(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(cache, "get", down)
    invalidate_local()
    first, second = current_generation(), current_generation()
    assert first != second and first < 0 and second < 0
    assert snapshot_for(bob) is not snapshot_for(bob)
    UALEntry.objects.bulk_create([UALEntry(topic=t, principal_kind="account", account=bob,
                                           right="reply")])
    assert check(bob, t, "reply")  # straight from the database


def test_threads_share_the_cache_safely():
    accounts = [make_account(f"user{i}") for i in range(4)]
    t = Topic.objects.create(path="/t")
    for account in accounts[:2]:
        UALEntry.objects.create(topic=t, principal_kind="account", account=account,
                                right="publish")
    expected = {a.pk: i < 2 for i, a in enumerate(accounts)}
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker() -> None:
        try:
            topic = Topic.objects.get(pk=t.pk)
            for n in range(300):
                account = accounts[n % len(accounts)]
                snap = snapshot_for(account)
                assert snap.account.pk == account.pk
                assert snap.allows(topic, "publish") is expected[account.pk]
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def invalidator() -> None:
        try:
            while not stop.is_set():
                invalidate_local()
                resolution.bump_generation()
                time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)

    spoiler = threading.Thread(target=invalidator)
    spoiler.start()
    workers = [threading.Thread(target=worker) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=scaled(60))
    stop.set()
    spoiler.join(timeout=scaled(10))
    assert not errors, errors
    assert all(not w.is_alive() for w in workers)
