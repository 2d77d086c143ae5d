"""Operators' tools (issue 36), what RabbitMQ's management API and ``rabbitmqadmin`` give:
live sessions with their counters, closing one, a topic's consumers with their backlog and
lag, purging a topic's pending messages, peeking at messages without consuming them, and
the broker's definitions (topics, accounts without secrets, UAL entries, links) as one JSON
document, exported and imported again.

Every door that offers these (the REST API, ``smqp admin`` over it, the console) calls
these functions; the caller checks that its user is staff with the model permission. What
changes something is audited in Django's admin log (the console's "Recent actions"), and a
purge also as one usage event per message, as REMOVE MESSAGE is.
"""

from __future__ import annotations

import redis
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Count, Min, ProtectedError
from django.utils import timezone

from accounts.models import Account, LoginSession
from broker.models import Delivery, Link, Message, Subscription, UsageEvent
from broker.store import opsmetrics
from topics import tree as topic_tree
from topics.models import QUEUE_PARAMETERS, Topic
from ual.audit import acting_as
from ual.models import UALEntry
from ual.resolution import snapshot_for

from . import accounts as account_service
from . import bad_request, conflict, not_found, notify, stats
from . import federation as federation_service
from . import topics as topic_service
from .read import load_for_delivery
from .removal import trash_messages

#: Sessions listed at most (newest first), as the console's list.
MAX_SESSIONS = 500
#: Messages a peek returns at most.
MAX_PEEK = 100
#: ``detail`` of the usage events of a purge (kind ``expire``: into Trash).
PURGED = {"reason": "purge"}
#: Format of the definitions document.
DEFINITIONS_VERSION = 1


def _audit(actor: Account, obj, flag: int, message: str) -> None:
    """One line in Django's admin log, the console's "Recent actions"."""
    LogEntry.objects.log_actions(
        user_id=actor.pk, queryset=[obj], action_flag=flag, change_message=message,
        single_object=True)


# -------------------------------------------------------------------------------- sessions


def sessions(*, account: str | None = None, guid: str | None = None,
             before: int | None = None, limit: int = MAX_SESSIONS) -> tuple[list[dict], int | None]:
    """Live sessions, newest first, and the cursor of the next page (None: no more): door,
    account, client address, login time, messages in (published) and out (sent to it),
    unacked (sent, ACK awaited: its listener's word, about once a second), locked
    (queue-mode locks in the store) and rates (per second, the last minute).
    ``counters_unavailable`` says why the counters are 0 when Redis cannot be read."""
    qs = LoginSession.objects.filter(ended__isnull=True).select_related("account")
    if account is not None:
        qs = qs.filter(account__username_key=account.casefold())
    if guid is not None:
        qs = qs.filter(guid=guid)
    if before is not None:
        qs = qs.filter(pk__lt=before)
    found = list(qs.order_by("-pk")[:limit + 1])
    more = len(found) > limit
    found = found[:limit]
    guids = [s.guid for s in found if s.guid]
    locked = dict(Delivery.objects.filter(state=Delivery.State.NOTIFIED, holder__in=guids)
                  .values("holder").annotate(n=Count("id")).values_list("holder", "n"))
    try:
        counters, unavailable = opsmetrics.sessions(guids), None
    except redis.RedisError as exc:
        counters, unavailable = {}, f"Redis: {exc}"
    zero = {"in": 0, "out": 0, "unacked": 0, "rate_in": 0.0, "rate_out": 0.0}
    out = []
    for s in found:
        c = counters.get(s.guid or "", zero)
        out.append({**stats.session_data(s), "messages_in": c["in"],
                    "messages_out": c["out"], "unacked": c["unacked"],
                    "locked": locked.get(s.guid, 0), "rate_in": c["rate_in"],
                    "rate_out": c["rate_out"], "counters_unavailable": unavailable})
    return out, (found[-1].pk if more else None)


def close_session(actor: Account, guid: str) -> None:
    """Ask the listener holding the session to close it (NOTIFY SERVER BYE, then the
    connection ends, its locks with it); 404 when no live session has this guid."""
    session = LoginSession.objects.filter(guid=guid, ended__isnull=True).first()
    if session is None or not stats.close_session(guid):
        raise not_found("session")
    _audit(actor, session, CHANGE, f"Closed session {guid}.")


# ------------------------------------------------------------------------ topics: consumers


def _real_topic(path: str) -> tuple[Topic, Topic]:
    """(the topic as named, its real topic); 404 for none. A topic being removed is
    still there for these (a purge lets it go sooner)."""
    found = topic_service.find(path)
    if found is None:
        raise not_found("topic")
    return found, found.resolved()


def consumers(path: str) -> dict:
    """The topic's subscribing accounts, each with its subscriptions, live sessions,
    backlog (deliveries waiting for it), locked (queue mode: held by its sessions), dead,
    and lag: how long the oldest message waiting for it has waited (seconds; 0 when none
    waits). The topic's own figures too: messages pending, its oldest's age."""
    found, real = _real_topic(path)
    now = timezone.now()
    account_ids = sorted(topic_service.subscriber_accounts(found))
    keys = topic_service.covering_patterns(real.key)
    if found.is_virtual:
        keys += topic_service.covering_patterns(found.key)
    subs: dict[int, list[dict]] = {}
    for sub in Subscription.objects.filter(resource=Subscription.Resource.MESSAGE,
                                           pattern_key__in=keys).order_by("pk"):
        subs.setdefault(sub.account_id, []).append({
            "id": sub.pk, "pattern": sub.pattern,
            "selector": ({"class": sub.selector_class, "text": sub.selector}
                         if sub.selector_class else None),
            "lease_end": sub.lease_end.isoformat() if sub.lease_end else None})
    per: dict[int, dict] = {a: {"backlog": 0, "locked": 0, "dead": 0, "oldest": None}
                            for a in account_ids}
    names = {Delivery.State.PENDING: "backlog", Delivery.State.NOTIFIED: "locked",
             Delivery.State.DEAD: "dead"}
    for r in (Delivery.objects.filter(message__topic_id=real.pk, state__in=list(names))
              .values("account_id", "state")
              .annotate(n=Count("id"), oldest=Min("message__received"))):
        row = per.setdefault(r["account_id"], {"backlog": 0, "locked": 0, "dead": 0,
                                               "oldest": None})
        row[names[r["state"]]] = r["n"]
        if r["state"] != Delivery.State.DEAD and r["oldest"] is not None and (
                row["oldest"] is None or r["oldest"] < row["oldest"]):
            row["oldest"] = r["oldest"]
    accounts = dict(Account.objects.filter(pk__in=list(per)).values_list("pk", "username"))
    live = {}
    for s in stats.live_sessions(account_ids=list(per)):
        live.setdefault(s["account"], []).append(s["guid"])
    pending = Message.objects.filter(topic_id=real.pk, state=Message.State.PENDING)
    oldest = pending.aggregate(at=Min("received"))["at"]
    out = []
    for account_id in sorted(per, key=lambda a: accounts.get(a, "")):
        if account_id not in accounts:
            continue
        row = per[account_id]
        name = accounts[account_id]
        out.append({"account": name, "subscriptions": subs.get(account_id, []),
                    "sessions": live.get(name, []), "backlog": row["backlog"],
                    "locked": row["locked"], "dead": row["dead"],
                    "lag_seconds": _age(now, row["oldest"])})
    return {"topic": real.path, "asked": found.path, "delivery_mode": real.delivery_mode,
            "messages": pending.count(), "oldest_seconds": _age(now, oldest),
            "consumers": out}


def _age(now, then) -> float:
    return round(max(0.0, (now - then).total_seconds()), 3) if then is not None else 0.0


# --------------------------------------------------------------------------- topics: purge


def purge(actor: Account, path: str) -> dict:
    """Every message pending on the topic (its real topic, for a virtual one) goes to its
    Trash, as REMOVE MESSAGE * would (REPUBLISH can still bring one back until the Trash
    purge); their open deliveries end. Audited: the admin log, and a usage
    event per message. ``{"topic": real topic, "purged": count}``."""
    _, real = _real_topic(path)
    with transaction.atomic():
        rows = Message.objects.select_for_update().filter(topic_id=real.pk,
                                                          state=Message.State.PENDING)
        ids = list(rows.order_by("pk").values_list("pk", flat=True))
        withdrawn = list(Delivery.objects.filter(
            message_id__in=ids, state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED])
            .values_list("account_id", "message_id"))
        trash_messages(actor.username, real.path, ids)
        if ids:
            # Marked as a purge (trash_messages records them as REMOVE MESSAGE's).
            UsageEvent.objects.create(kind=UsageEvent.Kind.TOPIC, account=actor.username,
                                      topic=real.path, detail={**PURGED, "count": len(ids)})
        _audit(actor, real, CHANGE, f"Purged {len(ids)} pending message(s) from {real.path}.")
        transaction.on_commit(lambda: notify.deliveries_withdrawn(withdrawn))
    return {"topic": real.path, "purged": len(ids)}


# ---------------------------------------------------------------------------- topics: peek


def peek(path: str, count: int = 10, after: int = 0, trash: bool = False) -> list[dict]:
    """Up to ``count`` messages pending on the topic (or in its Trash) after smuid
    ``after``, oldest first, with their data and their deliveries' states: read only (no
    lock taken, no delivery changed), like RabbitMQ's "get messages" with requeue."""
    _, real = _real_topic(path)
    count = max(1, min(count, MAX_PEEK))
    state = Message.State.TRASH if trash else Message.State.PENDING
    rows = list(Message.objects.filter(topic_id=real.pk, state=state, pk__gt=after)
                .order_by("pk").values_list("pk", "received", "size")[:count])
    ids = [r[0] for r in rows]
    loaded = load_for_delivery(ids)
    states: dict[int, dict[str, int]] = {}
    for r in (Delivery.objects.filter(message_id__in=ids).values("message_id", "state")
              .annotate(n=Count("id"))):
        states.setdefault(r["message_id"], {})[r["state"]] = r["n"]
    out = []
    for smuid, received, size in rows:
        if smuid not in loaded:
            continue
        topic, cmuid, msg = loaded[smuid]
        out.append({"smuid": smuid, "topic": topic, "cmuid": cmuid, "message": msg,
                    "received": received.isoformat(), "size": size,
                    "deliveries": states.get(smuid, {})})
    return out


# -------------------------------------------------------------------------------- accounts


def find_account(name: str) -> Account:
    account = Account.objects.filter(username_key=name.casefold()).first() \
        if name and "\x00" not in name else None
    if account is None:
        raise not_found("account")
    return account


#: What change_account may set, and how long each text may be.
ACCOUNT_TEXT = {"email": 254, "proper_name": 200, "postal_address": 1000, "phone": 64}
ACCOUNT_FLAGS = ("is_active", "is_staff", "is_superuser", "is_remote_server")


@transaction.atomic
def change_account(actor: Account, name: str, changes: dict) -> Account:
    """Change an account's details and flags; a field not given keeps its value. An
    operator cannot deactivate or demote the account it acts as (409): it would lock
    itself out mid-request."""
    account = Account.objects.select_for_update().filter(pk=find_account(name).pk).get()
    unknown = set(changes) - set(ACCOUNT_TEXT) - set(ACCOUNT_FLAGS)
    if unknown:
        raise bad_request(f"not an account field: {', '.join(sorted(unknown))}")
    if account.pk == actor.pk and any(
            changes.get(f) is False for f in ("is_active", "is_staff", "is_superuser")):
        raise conflict("an operator cannot deactivate or demote its own account")
    for field, value in changes.items():
        if field in ACCOUNT_TEXT:
            value = str(value).strip()
            if len(value) > ACCOUNT_TEXT[field]:
                raise bad_request(f"{field} longer than {ACCOUNT_TEXT[field]} characters")
            if field == "email" and value:
                try:
                    validate_email(value)
                except ValidationError as exc:
                    raise bad_request("invalid e-mail address") from exc
        setattr(account, field, value)
    if changes:
        account.save(update_fields=list(changes))
        _audit(actor, account, CHANGE, f"Changed {', '.join(sorted(changes))} (api).")
    if changes.get("is_active") is False:
        for guid in LoginSession.objects.filter(account=account, ended__isnull=True) \
                .values_list("guid", flat=True):
            if guid:
                stats.close_session(guid)  # a deactivated account's sessions end too
    return account


@transaction.atomic
def reset_password(actor: Account, name: str, password: str) -> None:
    """Set an account's password (the validators apply); its SMQP SCRAM verifier follows
    (accounts.scram derives it from the Django hash)."""
    account = Account.objects.select_for_update().filter(pk=find_account(name).pk).get()
    account_service.set_checked_password(account, password)
    account.save(update_fields=["password"])
    _audit(actor, account, CHANGE, "Password reset (api).")


@transaction.atomic
def delete_account(actor: Account, name: str) -> None:
    """Delete an account with its subscriptions, deliveries, tokens and UAL entries (its
    live sessions are closed). Not the account the operator acts as (409)."""
    account = find_account(name)
    if account.pk == actor.pk:
        raise conflict("an operator cannot delete its own account")
    guids = list(LoginSession.objects.filter(account=account, ended__isnull=True,
                                             guid__isnull=False).values_list("guid", flat=True))
    _audit(actor, account, DELETION, f"Deleted account {account.username} (api).")
    for guid in guids:
        stats.close_session(guid)
    try:
        with transaction.atomic(), acting_as(f"{actor.username} (api)"):
            account.delete()
    except ProtectedError as exc:  # a virtual topic stands for its account topic
        names = ", ".join(sorted(str(t) for t in exc.protected_objects)[:5])
        raise conflict(f"virtual topics link to its account topic: {names}") from None


# ----------------------------------------------------------------------------- definitions


def export_definitions() -> dict:
    """The broker's definitions as one JSON-able document: topics (path, delivery mode,
    queue parameters set on the topic itself, keywords, virtual link), accounts (no
    password or verifier: they are secrets; an imported account gets none and must be
    given one), groups, UAL entries and federation links (no password). Account topics
    (``/accounts/<name>``) come with their accounts and are not listed."""
    tree = topic_tree.tree()
    topics = []
    for topic in (Topic.objects.filter(state=Topic.State.ACTIVE, account__isnull=True)
                  .select_related("link").order_by("key")):
        node = tree.by_id.get(topic.pk)
        params = {name: getattr(topic, name) for name in QUEUE_PARAMETERS
                  if getattr(topic, name) is not None}
        topics.append({"path": topic.path, "delivery_mode": topic.delivery_mode,
                       "parameters": params,
                       "keywords": list(node.keywords) if node is not None
                       else topic_service.keywords_of(topic),
                       "link": topic.link.path if topic.link_id else None})
    accounts = [{"username": a.username, "email": a.email, "proper_name": a.proper_name,
                 "is_active": a.is_active, "is_staff": a.is_staff,
                 "is_superuser": a.is_superuser, "is_remote_server": a.is_remote_server,
                 "groups": sorted(g.name for g in a.groups.all())}
                for a in Account.objects.prefetch_related("groups").order_by("username_key")]
    entries = [{"topic": e.topic.path, "principal_kind": e.principal_kind,
                "account": e.account.username if e.account_id else None,
                "group": e.group.name if e.group_id else None,
                "right": e.right, "effect": e.effect}
               for e in UALEntry.objects.select_related("topic", "account", "group")
               .order_by("topic__key", "pk")]
    links = []
    for link in Link.objects.select_related("peer_account").order_by("name"):
        links.append({"name": link.name, "host": link.host, "port": link.port,
                      "tls": link.tls, "tls_ca": link.tls_ca,
                      "tls_server_name": link.tls_server_name, "account": link.account,
                      "imports": [p.strip() for p in link.imports.split(",") if p.strip()],
                      "peer_account": link.peer_account.username if link.peer_account_id
                      else None, "enabled": link.enabled})
    return {"smqp_definitions": DEFINITIONS_VERSION,
            "exported": timezone.now().isoformat(),
            "groups": sorted(Group.objects.values_list("name", flat=True)),
            "accounts": accounts, "topics": topics, "ual_entries": entries, "links": links}


def import_definitions(actor: Account, doc: dict) -> dict[str, dict[str, int]]:
    """Apply a definitions document (:func:`export_definitions`' form, already checked by
    the caller's schema) in one transaction: what is missing is created, what differs is
    changed, what is the same is left as it is, and nothing is deleted; so importing the
    same document twice changes nothing the second time. An account created here has no
    usable password (secrets are not exported). Returns per kind how many were created,
    changed and unchanged. A refusal (a topic path no topic can have, a link to a missing
    topic) rolls it all back and names the item."""
    counts = {kind: {"created": 0, "changed": 0, "unchanged": 0}
              for kind in ("groups", "accounts", "topics", "ual_entries", "links")}
    snap = snapshot_for(actor)
    with transaction.atomic(), acting_as(f"{actor.username} (import)"):
        for name in doc.get("groups", []):
            _, created = Group.objects.get_or_create(name=name)
            counts["groups"]["created" if created else "unchanged"] += 1
        for item in doc.get("accounts", []):
            counts["accounts"][_import_account(actor, item)] += 1
        # Real topics first, parents before children (sorted by path), then virtual ones.
        ordered = sorted(doc.get("topics", []), key=lambda t: (t.get("link") is not None,
                                                              t["path"].count("/"),
                                                              t["path"].casefold()))
        for item in ordered:
            try:
                counts["topics"][_import_topic(snap, item)] += 1
            except Exception as exc:
                _name(exc, f"topic {item['path']}")
                raise
        for item in doc.get("ual_entries", []):
            try:
                counts["ual_entries"][_import_entry(item)] += 1
            except Exception as exc:
                _name(exc, f"UAL entry on {item['topic']}")
                raise
        for item in doc.get("links", []):
            try:
                counts["links"][_import_link(item)] += 1
            except Exception as exc:
                _name(exc, f"link {item['name']}")
                raise
        _audit(actor, actor, CHANGE, "Imported definitions: " + "; ".join(
            f"{k} {v['created']} created, {v['changed']} changed" for k, v in counts.items()))
    return counts


def _name(exc: Exception, what: str) -> None:
    """Say which item a refusal is about (the service's text alone does not)."""
    if hasattr(exc, "text"):
        exc.text = f"{exc.text} [{what}]"  # type: ignore[attr-defined]


def _import_account(actor: Account, item: dict) -> str:
    account = Account.objects.filter(username_key=item["username"].casefold()).first()
    fields = {k: item[k] for k in ("email", "proper_name", *ACCOUNT_FLAGS) if k in item}
    groups = set(item.get("groups", []))
    if account is None:
        account = Account(username=item["username"], **fields)
        try:
            account.full_clean(exclude=["password", "username_key"])
        except ValidationError as exc:
            raise bad_request(f"account {item['username']}: " + "; ".join(exc.messages)) \
                from exc
        account.set_unusable_password()
        account.save()
        account.groups.set(Group.objects.filter(name__in=groups))
        return "created"
    changed = {k: v for k, v in fields.items() if getattr(account, k) != v}
    if account.pk == actor.pk and any(changed.get(f) is False
                                      for f in ("is_active", "is_staff", "is_superuser")):
        raise conflict(f"account {account.username}: an operator cannot deactivate or "
                       f"demote its own account")
    if changed:
        for k, v in changed.items():
            setattr(account, k, v)
        account.save(update_fields=list(changed))
    have = set(account.groups.values_list("name", flat=True))
    if "groups" in item and have != groups:
        account.groups.set(Group.objects.filter(name__in=groups))
        changed["groups"] = True
    return "changed" if changed else "unchanged"


def _import_topic(snap, item: dict) -> str:
    path = item["path"]
    topic = topic_service.find(path)
    outcome = "unchanged"
    if topic is None:
        topic_service.create_topic(snap, path, tuple(item.get("keywords") or ()),
                                   item.get("link"))
        topic = topic_service.find(path)
        outcome = "created"
    elif (topic.link.path if topic.link_id else None) != item.get("link"):
        raise conflict(f"topic {topic.path} exists with another virtual link")
    elif "keywords" in item and topic_service.keywords_of(topic) != list(item["keywords"]):
        topic_service.set_keywords(snap, path, tuple(item["keywords"]))
        outcome = "changed"
    if topic is not None and not topic.is_virtual:
        wanted = {name: (item.get("parameters") or {}).get(name) for name in QUEUE_PARAMETERS}
        if "delivery_mode" in item:
            wanted["delivery_mode"] = item["delivery_mode"]
        differ = {k: v for k, v in wanted.items() if getattr(topic, k) != v}
        if differ:
            topic_service.set_parameters(snap, path, differ)
            outcome = "changed" if outcome == "unchanged" else outcome
    return outcome


def _import_entry(item: dict) -> str:
    topic = topic_service.find(item["topic"])
    if topic is None:
        raise not_found(f"topic {item['topic']}")
    account = group = None
    if item.get("account"):
        account = Account.objects.filter(username_key=item["account"].casefold()).first()
        if account is None:
            raise bad_request(f"no account {item['account']}")
    if item.get("group"):
        group = Group.objects.filter(name=item["group"]).first()
        if group is None:
            raise bad_request(f"no group {item['group']}")
    same = UALEntry.objects.filter(topic=topic, principal_kind=item["principal_kind"],
                                   account=account, group=group, right=item["right"])
    existing = same.first()
    if existing is not None:
        if existing.effect == item["effect"]:
            return "unchanged"
        existing.effect = item["effect"]
        existing.save(update_fields=["effect"])
        return "changed"
    entry = UALEntry(topic=topic, principal_kind=item["principal_kind"], account=account,
                     group=group, right=item["right"], effect=item["effect"])
    try:
        entry.full_clean()
    except ValidationError as exc:
        raise bad_request("; ".join(exc.messages)) from exc
    entry.save()
    return "created"


def _import_link(item: dict) -> str:
    settings_ = {k: v for k, v in item.items() if k != "name"}
    existing = Link.objects.select_related("peer_account").filter(
        name__iexact=item["name"]).first()
    if existing is None:
        federation_service.save_link(item["name"], create=True, **settings_)
        return "created"
    now = {k: v for k, v in _link_settings(existing).items() if k in settings_}
    if now == settings_:
        return "unchanged"
    federation_service.save_link(existing.name, create=False, **settings_)
    return "changed"


def _link_settings(link: Link) -> dict:
    return {"host": link.host, "port": link.port, "tls": link.tls, "tls_ca": link.tls_ca,
            "tls_server_name": link.tls_server_name, "account": link.account,
            "imports": [p.strip() for p in link.imports.split(",") if p.strip()],
            "peer_account": link.peer_account.username if link.peer_account_id else None,
            "enabled": link.enabled}


__all__ = [
    "change_account",
    "close_session",
    "consumers",
    "delete_account",
    "export_definitions",
    "find_account",
    "import_definitions",
    "peek",
    "purge",
    "reset_password",
    "sessions",
]
