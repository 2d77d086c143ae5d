"""Access list entries over the REST door (issue 24): who may list, add and remove entries,
and the explanation of a decision. One rule: an entry on a topic is managed by staff, or by
an account with the manage right on that topic (which it must be able to see: 404 else, as
everywhere). The decision itself and its explanation are the UAL's own
(:mod:`ual.resolution`, :func:`ual.console.explain`, the admin's effective-rights page)."""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts.models import Account
from topics import tree as topic_tree
from ual.audit import acting_as
from ual.console import explain as explain_rights
from ual.models import PrincipalKind, Right, UALEntry
from ual.resolution import AccessSnapshot

from . import bad_request, conflict, not_found, unauthorized
from . import topics as topic_service
from .freshness import answer_from_fresh_caches

#: A page of entries for a non-staff account reads at most this many rows to fill it.
SCAN_LIMIT = 5000


def is_staff(snapshot: AccessSnapshot) -> bool:
    account = snapshot.account
    return account.is_active and (account.is_staff or account.is_superuser)


def _may_manage(snapshot: AccessSnapshot, topic) -> bool:
    return is_staff(snapshot) or snapshot.allows(topic, Right.MANAGE)


def entry_data(entry: UALEntry) -> dict:
    return {"id": entry.pk, "topic": entry.topic.path, "principal_kind": entry.principal_kind,
            "account": entry.account.username if entry.account_id else None,
            "group": entry.group.name if entry.group_id else None,
            "right": entry.right, "effect": entry.effect}


def entries(snapshot: AccessSnapshot, *, topic: str | None, account: str | None,
            after: int | None, limit: int) -> tuple[list[UALEntry], bool]:
    """One page (by id) of the entries the account may manage; True when more follow."""
    rows = UALEntry.objects.select_related("topic", "account", "group").order_by("pk")
    if topic is not None:
        rows = rows.filter(topic_id=topic_service.visible_node(snapshot, topic).pk)
    if account is not None:
        rows = rows.filter(account__username_key=account.casefold())
    if after is not None:
        rows = rows.filter(pk__gt=after)
    tree = topic_tree.tree()
    found: list[UALEntry] = []
    for entry in rows[:SCAN_LIMIT]:
        node = tree.by_id.get(entry.topic_id)
        if node is None or not (is_staff(snapshot) or (
                snapshot.can_see(node) and snapshot.allows(node, Right.MANAGE))):
            continue
        found.append(entry)
        if len(found) > limit:
            return found[:limit], True
    return found, False


def _managed_entry(snapshot: AccessSnapshot, entry_id: int) -> UALEntry:
    entry = UALEntry.objects.select_related("topic", "account", "group").filter(
        pk=entry_id).first()
    node = topic_tree.tree().by_id.get(entry.topic_id) if entry is not None else None
    if node is None or not (is_staff(snapshot) or snapshot.can_see(node)):
        raise not_found("entry")
    if not _may_manage(snapshot, node):
        raise unauthorized(f"no manage right on {node.path}")
    return entry


@answer_from_fresh_caches
def get(snapshot: AccessSnapshot, entry_id: int) -> UALEntry:
    return _managed_entry(snapshot, entry_id)


@answer_from_fresh_caches
@transaction.atomic
def create(snapshot: AccessSnapshot, path: str, kind: str, account: str | None,
           group: str | None, right: str, effect: str) -> UALEntry:
    topic = topic_service.get_visible(snapshot, path)
    if not _may_manage(snapshot, topic):
        raise unauthorized(f"no manage right on {topic.path}")
    entry = UALEntry(topic=topic, principal_kind=kind, right=right, effect=effect)
    if account:
        entry.account = Account.objects.filter(username_key=account.casefold()).first()
        if entry.account is None:
            raise bad_request("no such account")
    if group:
        entry.group = Group.objects.filter(name=group).first()
        if entry.group is None:
            raise bad_request("no such group")
    if kind == PrincipalKind.EVERYONE and (account or group):
        raise bad_request("an entry for everyone names no account or group")
    try:
        entry.full_clean()
    except ValidationError as exc:
        raise bad_request("; ".join(exc.messages)) from exc
    try:
        with transaction.atomic(), acting_as(f"{snapshot.account.username} (api)"):
            entry.save()
    except IntegrityError as exc:
        raise conflict("such an entry exists") from exc
    return entry


@answer_from_fresh_caches
@transaction.atomic
def delete(snapshot: AccessSnapshot, entry_id: int) -> None:
    entry = _managed_entry(snapshot, entry_id)
    with acting_as(f"{snapshot.account.username} (api)"):
        entry.delete()  # one row: its signals audit it and refresh every process's cache


@answer_from_fresh_caches
def explain(snapshot: AccessSnapshot, account_name: str, path: str,
            right: str | None = None) -> dict:
    """Every right (or one) of an account on a topic, decided and explained as the admin's
    effective-rights page does. Staff may ask about any account, others about their own."""
    topic = topic_service.get_visible(snapshot, path)
    account = Account.objects.filter(username_key=account_name.casefold()).first()
    # Other accounts are not told apart from missing ones, but for staff.
    if account is None or not (is_staff(snapshot) or account.pk == snapshot.account.pk):
        raise not_found("account")
    result = explain_rights(account, topic)
    rights = [r for r in result.rights if right is None or r.right == right]
    return {
        "account": account.username, "topic": result.topic.path,
        "real_topic": result.real.path, "groups": result.groups,
        "rights": [{"right": r.right, "allowed": r.decision.allowed,
                    "explanation": r.explanation,
                    "entry": r.decision.entry_id, "level": r.level.path if r.level else None}
                   for r in rights],
        "levels": [{"path": level.path, "depth": level.depth,
                    "entries": {rt: [{"id": e.pk, "effect": e.effect,
                                      "principal": e.principal_label, "decides": decides}
                                     for e, decides in cells]
                                for rt, cells in level.cells.items()}}
                   for level in result.levels],
    }
