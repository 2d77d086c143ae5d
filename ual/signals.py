"""What keeps access decisions fresh and accounted for.

* Every change that can alter a UAL decision calls :func:`ual.resolution.changed`: this
  process forgets its access snapshots at once, and every process does within half a second of
  the commit. Such changes are: UAL entries saved or deleted; an account created, deleted, or
  with a changed name, ``is_active``, ``is_superuser`` or ``is_remote_server``; group
  membership (either side of the m2m) and deleted groups; topics created, deleted, renamed,
  moved, (un)linked or attached to an account.
* Every UAL entry saved or deleted leaves a :class:`ual.models.UALAuditLog` row, written in the
  same transaction, naming the actor (:mod:`ual.audit`).

Bulk ``QuerySet.update()`` sends no signal: code that changes access data must save rows one
by one (``manage.py grant`` does).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver

from topics.models import Topic

from . import audit
from .models import UALAuditLog, UALEntry
from .resolution import changed

# Account fields a decision depends on (username: the own-account-topic rule).
ACCOUNT_FIELDS = ("username", "is_active", "is_superuser", "is_remote_server")
# Topic fields a decision depends on (the key is the level; the link makes it virtual).
TOPIC_FIELDS = ("key", "parent_id", "link_id", "account_id")


def _relevant(update_fields: Any, fields: tuple[str, ...]) -> bool:
    if update_fields is None:
        return True
    names = {f.removesuffix("_id") for f in fields}
    return bool(names & {f.removesuffix("_id") for f in update_fields})


# ----------------------------------------------------------------------------- UAL entries


def entry_fields(entry: UALEntry) -> dict[str, Any]:
    """The entry as the audit log keeps it: names, not ids, so it reads after deletions."""
    return {
        "id": entry.pk,
        "topic": entry.topic.path if entry.topic_id else None,
        "principal_kind": entry.principal_kind,
        "account": entry.account.get_username() if entry.account_id else None,
        "group": entry.group.name if entry.group_id else None,
        "right": entry.right,
        "effect": entry.effect,
    }


def _summary(fields: dict[str, Any]) -> str:
    kind = fields["principal_kind"]
    who = {"everyone": "everyone", "group": f"group {fields['group']}"}.get(
        kind, f"{kind} {fields['account']}")
    return f"{fields['effect']} {fields['right']} to {who} on {fields['topic']}"


def _write_audit(action: str, entry: UALEntry, before: dict | None, after: dict | None) -> None:
    fields = after or before
    assert fields is not None
    summary = _summary(fields)
    if action == UALAuditLog.Action.CHANGED and before is not None:
        summary = f"{_summary(before)} → {summary}"
    UALAuditLog.objects.create(
        actor=audit.current_actor()[:150],
        action=action,
        entry_id=entry.pk,
        topic=(fields["topic"] or "")[:1024],
        summary=summary[:2000],
        before=before,
        after=after,
    )


@receiver(pre_save, sender=UALEntry, dispatch_uid="ual.entry_before_save")
def _entry_before_save(sender, instance: UALEntry, raw: bool = False, **kwargs) -> None:
    instance._ual_before = None
    if raw or instance._state.adding or instance.pk is None:
        return
    old = UALEntry.objects.select_related("topic", "account", "group").filter(
        pk=instance.pk).first()
    if old is not None:
        instance._ual_before = entry_fields(old)


@receiver(post_save, sender=UALEntry, dispatch_uid="ual.entry_saved")
def _entry_saved(sender, instance: UALEntry, created: bool, raw: bool = False,
                 using: str | None = None, **kwargs) -> None:
    changed(using)
    if raw:
        return
    after = entry_fields(instance)
    before = getattr(instance, "_ual_before", None)
    if created or before is None:
        _write_audit(UALAuditLog.Action.CREATED, instance, None, after)
    elif before != after:
        _write_audit(UALAuditLog.Action.CHANGED, instance, before, after)


@receiver(pre_delete, sender=UALEntry, dispatch_uid="ual.entry_before_delete")
def _entry_before_delete(sender, instance: UALEntry, **kwargs) -> None:
    # Names are read now: in a cascade the topic or account may be gone by post_delete.
    instance._ual_before = entry_fields(instance)


@receiver(post_delete, sender=UALEntry, dispatch_uid="ual.entry_deleted")
def _entry_deleted(sender, instance: UALEntry, using: str | None = None, **kwargs) -> None:
    changed(using)
    before = getattr(instance, "_ual_before", None) or {
        "id": instance.pk, "topic": None, "principal_kind": instance.principal_kind,
        "account": None, "group": None, "right": instance.right, "effect": instance.effect}
    _write_audit(UALAuditLog.Action.DELETED, instance, before, None)


# -------------------------------------------------------------------- accounts and groups


def _stored(model: type, pk: Any, fields: tuple[str, ...]) -> tuple | None:
    return model._base_manager.filter(pk=pk).values_list(*fields).first()


@receiver(pre_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="ual.account_before_save")
def _account_before_save(sender, instance, raw: bool = False, update_fields=None,
                         **kwargs) -> None:
    instance._ual_relevant = instance._state.adding or instance.pk is None
    if instance._ual_relevant or raw or not _relevant(update_fields, ACCOUNT_FIELDS):
        return
    now = tuple(getattr(instance, f) for f in ACCOUNT_FIELDS)
    instance._ual_relevant = _stored(sender, instance.pk, ACCOUNT_FIELDS) != now


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="ual.account_saved")
def _account_saved(sender, instance, created: bool, using: str | None = None,
                   **kwargs) -> None:
    if created or getattr(instance, "_ual_relevant", False):
        changed(using)


@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="ual.account_deleted")
def _account_deleted(sender, instance, using: str | None = None, **kwargs) -> None:
    changed(using)


def _membership_changed(sender, action: str, using: str | None = None, **kwargs) -> None:
    if action in ("post_add", "post_remove", "post_clear"):
        changed(using)


@receiver(post_delete, sender=Group, dispatch_uid="ual.group_deleted")
def _group_deleted(sender, instance: Group, using: str | None = None, **kwargs) -> None:
    changed(using)


def connect_membership_signal() -> None:
    """Account.groups' through model exists only once the apps are loaded."""
    from django.contrib.auth import get_user_model

    m2m_changed.connect(_membership_changed, sender=get_user_model().groups.through,
                        dispatch_uid="ual.membership_changed")


# ----------------------------------------------------------------------------------- topics


@receiver(pre_save, sender=Topic, dispatch_uid="ual.topic_before_save")
def _topic_before_save(sender, instance: Topic, raw: bool = False, update_fields=None,
                       **kwargs) -> None:
    instance._ual_relevant = instance._state.adding or instance.pk is None
    if instance._ual_relevant or raw or not _relevant(update_fields, TOPIC_FIELDS):
        return
    now = tuple(getattr(instance, f) for f in TOPIC_FIELDS)
    instance._ual_relevant = _stored(Topic, instance.pk, TOPIC_FIELDS) != now


@receiver(post_save, sender=Topic, dispatch_uid="ual.topic_saved")
def _topic_saved(sender, instance: Topic, created: bool, using: str | None = None,
                 **kwargs) -> None:
    if created or getattr(instance, "_ual_relevant", False):
        changed(using)


@receiver(post_delete, sender=Topic, dispatch_uid="ual.topic_deleted")
def _topic_deleted(sender, instance: Topic, using: str | None = None, **kwargs) -> None:
    changed(using)
