"""Topic tree operations: lookups, virtual links, account topics."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from accounts.models import Account
from topics import paths
from topics.models import Topic


def find(path: str) -> Topic | None:
    """The topic stored under ``path`` (case-insensitive), virtual or real, or None."""
    return Topic.objects.select_related("link").filter(key=paths.path_key(path)).first()


def _ensure_path(path: str, **defaults) -> Topic:
    """Get or create the topic at ``path`` and any missing ancestors."""
    parent: Topic | None = None
    parent_path = paths.parent_path(path)
    if parent_path is not None:
        parent = _ensure_path(parent_path)
    try:
        with transaction.atomic():
            topic, _ = Topic.objects.get_or_create(
                key=paths.path_key(path), defaults={"path": path, "parent": parent, **defaults}
            )
    except IntegrityError:  # created concurrently by another process
        topic = Topic.objects.get(key=paths.path_key(path))
    return topic


@transaction.atomic
def ensure_account_topic(account: Account) -> Topic:
    """``/accounts/<name>`` for ``account``, created (with ``/accounts``) if missing and
    renamed if the account was renamed."""
    path = account.account_topic_path
    paths.check_creatable(path)
    existing = Topic.objects.filter(account=account).first()
    if existing is not None:
        if existing.path != path:
            existing.path = path
            existing.save(update_fields=["path", "key", "updated"])
        return existing
    parent = _ensure_path(paths.ACCOUNTS_ROOT)
    topic = Topic.objects.filter(key=paths.path_key(path)).first()
    if topic is None:
        return Topic.objects.create(path=path, parent=parent, account=account)
    topic.account = account
    topic.save(update_fields=["account", "updated"])
    return topic
