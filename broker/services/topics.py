"""Topic tree operations (draft §4.1.2 to 4.1.7): lookups, COUNT, LIST, CREATE, REMOVE, SET TOPIC,
GET TOPIC KEYWORDS, FIND; virtual links (account topics are made by :mod:`.accounts`).

Rules enforced here, for every door: Trash is reserved; topics are case-insensitive; account
topics cannot be created, renamed or removed by commands; a virtual topic links only to a real
one and behaves like it; new topics inherit their parent's permissions (by the UAL walk up the
tree); LIST, FIND and COUNT never reveal a topic the account may not see.
"""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from broker.domain.values import TopicPattern
from broker.models import Message, Subscription
from topics import paths
from topics import tree as topic_tree
from topics.models import Topic, TopicKeyword
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot, level_keys, snapshot_for_id

from . import (
    bad_request,
    conflict,
    not_allowed,
    not_found,
    notify,
    too_large,
    unauthorized,
)
from .freshness import answer_from_fresh_caches

TRASH = "trash"


# --------------------------------------------------------------------------------- lookups


def find(path: str) -> Topic | None:
    """The topic stored under ``path`` (case-insensitive), virtual or real, or None."""
    return Topic.objects.select_related("link").filter(key=paths.path_key(path)).first()


def node(path: str) -> Node | None:
    """The topic at ``path`` from the in-memory tree (no query)."""
    return topic_tree.tree().find(paths.path_key(path))


def visible_node(snapshot: AccessSnapshot, path: str) -> Node:
    """Like :func:`get_visible`, from the in-memory tree: 404 for missing, hidden or
    removing topics."""
    found = node(path)
    if found is None or found.state != Topic.State.ACTIVE or not snapshot.can_see(found):
        raise not_found("topic")
    return found


def _active(nodes):
    return [n for n in nodes if n.state == Topic.State.ACTIVE]


def get_visible(snapshot: AccessSnapshot, path: str, *, include_removing: bool = False) -> Topic:
    """The topic at ``path`` if the account may see it; 404 otherwise (never 401, which
    would reveal that it exists)."""
    topic = find(path)
    if topic is None or not snapshot.can_see(topic):
        raise not_found("topic")
    if topic.state != Topic.State.ACTIVE and not include_removing:
        raise not_found("topic")
    return topic


def split_trash(path: str) -> tuple[str, bool]:
    """``/a/b/Trash`` names the Trash queue of ``/a/b``."""
    head, _, last = path.rpartition("/")
    if head and last.casefold() == TRASH:
        return head, True
    return path, False


def _descendants(base_key: str):
    return Topic.objects.filter(key__startswith=base_key.rstrip("/") + "/")


def matching_topics(snapshot: AccessSnapshot, pattern: TopicPattern) -> list[Node]:
    """Visible, active topics a pattern names: the topic itself, or every descendant (404
    when the pattern's base is not visible)."""
    tree = topic_tree.tree()
    if pattern.wildcard:
        if pattern.base in ("", "/"):
            topics = [tree.by_key[k] for k in tree.sorted_keys]
        else:
            visible_node(snapshot, pattern.base)
            topics = tree.descendants(paths.path_key(pattern.base))
        return [t for t in _active(topics) if snapshot.can_see(t)]
    return [visible_node(snapshot, pattern.base)]


# ------------------------------------------------------------------------------- COUNT/LIST


@answer_from_fresh_caches
def children(snapshot: AccessSnapshot, path: str) -> list[Node]:
    """LIST TOPIC: the visible children of ``path`` (``/``: the first-level topics)."""
    return _children(snapshot, path)


def _children(snapshot: AccessSnapshot, path: str) -> list[Node]:
    parent_id = None if path == "/" else visible_node(snapshot, path).pk
    kids = topic_tree.tree().children.get(parent_id, [])
    return [t for t in _active(kids) if snapshot.can_see(t)]


@answer_from_fresh_caches
def count_topics(snapshot: AccessSnapshot, pattern: TopicPattern) -> int:
    """COUNT TOPIC: children of a topic, or with a wildcard all descendants at any depth."""
    if not pattern.wildcard:
        return len(_children(snapshot, pattern.base))
    return len(matching_topics(snapshot, pattern))


def _message_topics(snapshot: AccessSnapshot, pattern: TopicPattern) -> tuple[list[Node], bool]:
    base, trash = split_trash(pattern.base) if not pattern.wildcard else (pattern.base, False)
    topics = matching_topics(snapshot, TopicPattern(base, pattern.wildcard))
    real = {t.resolved().pk: t.resolved() for t in topics}
    return list(real.values()), trash


def _require(snapshot: AccessSnapshot, topic: Topic, right: str) -> None:
    if not snapshot.allows(topic, right):
        raise unauthorized(f"no {right} right on {topic.path}")


@answer_from_fresh_caches
def count_messages(snapshot: AccessSnapshot, pattern: TopicPattern) -> int:
    """COUNT MESSAGE: messages now held in the queue(s) (or in Trash for ``/t/Trash``)."""
    topics, trash = _message_topics(snapshot, pattern)
    allowed = [t.pk for t in topics if snapshot.allows(t, Right.SUBSCRIBE)]
    if not pattern.wildcard and not allowed:
        _require(snapshot, topics[0], Right.SUBSCRIBE)
    state = Message.State.TRASH if trash else Message.State.PENDING
    return Message.objects.filter(topic_id__in=allowed, state=state).count()


@answer_from_fresh_caches
def list_messages(snapshot: AccessSnapshot, path: str) -> list[int]:
    """LIST MESSAGE: the smuids now in the queue (or in its Trash)."""
    topics, trash = _message_topics(snapshot, TopicPattern(path, False))
    _require(snapshot, topics[0], Right.SUBSCRIBE)
    state = Message.State.TRASH if trash else Message.State.PENDING
    return list(
        Message.objects.filter(topic_id=topics[0].pk, state=state).order_by("pk")
        .values_list("pk", flat=True)
    )


def covering_patterns(key: str) -> list[str]:
    """Subscription pattern keys that cover the topic ``key``: itself and ``/ancestor/*``."""
    return [key] + [level + "/*" for level in level_keys(key.rpartition("/")[0])]


def subscriber_accounts(topic: Topic, resource: str = Subscription.Resource.MESSAGE) -> set[int]:
    """Accounts subscribed to ``resource`` of the topic, by its own name or, for a virtual
    topic, by the real topic's name."""
    keys = covering_patterns(topic.resolved().key)
    if topic.is_virtual:
        keys += covering_patterns(topic.key)
    return set(
        Subscription.objects.filter(resource=resource, pattern_key__in=keys)
        .values_list("account_id", flat=True)
    )


@answer_from_fresh_caches
def count_subscribers(snapshot: AccessSnapshot, pattern: TopicPattern) -> int:
    """COUNT SUBSCRIBERS: accounts subscribed to the topic's messages (with a wildcard, to any
    topic below it)."""
    accounts: set[int] = set()
    for topic in matching_topics(snapshot, pattern):
        accounts |= subscriber_accounts(topic)
    return len(accounts)


# --------------------------------------------------------------------------------- CREATE


def _check_new_path(path: str) -> None:
    try:
        paths.check_creatable(path)
    except paths.InvalidTopicPath as exc:
        raise not_allowed("Trash is a reserved topic name") from exc
    if paths.is_under_accounts(path):
        raise not_allowed("account topics are made with accounts")


def _parent_for(snapshot: AccessSnapshot, path: str) -> Topic | None:
    parent_path = paths.parent_path(path)
    if parent_path is None:
        return None
    parent = find(parent_path)
    if parent is None or parent.state != Topic.State.ACTIVE or not snapshot.can_see(parent):
        raise not_found("parent topic")  # a hidden parent answers as a missing one
    if parent.is_virtual:
        raise not_allowed("a virtual topic has no children")
    return parent


def _require_manage(snapshot: AccessSnapshot, parent: Topic | None, what: str) -> None:
    if parent is None:
        if not snapshot.superuser:
            raise unauthorized(f"no manage right at the root to {what}")
    elif not snapshot.allows(parent, Right.MANAGE):
        raise unauthorized(f"no manage right on {parent.path}")


def _set_keywords(topic: Topic, keywords: tuple[str, ...]) -> None:
    TopicKeyword.objects.filter(topic=topic).delete()
    seen: set[str] = set()
    rows = []
    for kw in keywords:
        if kw.casefold() not in seen:
            seen.add(kw.casefold())
            rows.append(TopicKeyword(topic=topic, keyword=kw, key=kw.casefold(),
                                     position=len(rows)))
    TopicKeyword.objects.bulk_create(rows)
    topic_tree.changed()  # bulk_create sends no signals


def _topic_watchers(topic_key: str) -> set[int]:
    return set(
        Subscription.objects.filter(resource=Subscription.Resource.TOPIC,
                                    pattern_key__in=covering_patterns(topic_key))
        .values_list("account_id", flat=True)
    )


def _notify_topic(topic: Topic, action: str, value: str | None = None,
                  key: str | None = None) -> None:
    """Tell TOPIC subscribers that can see ``topic``."""
    watchers = _topic_watchers(key or topic.key)
    if not watchers:
        return
    allowed = [a for a in sorted(watchers) if snapshot_for_id(a).can_see(topic)]
    notify.send_after_commit(allowed, notify.topic_event(topic.path, action, value))


def create_for_server(path: str, parent: Topic | None) -> Topic:
    """A topic the server makes itself (a federation link's import), no account's rights
    asked; TOPIC subscribers that can see it are told once it commits. IntegrityError when
    it exists (made concurrently)."""
    with transaction.atomic():
        topic = Topic.objects.create(path=path, parent=parent)
    _notify_topic(topic, "ADDED")
    return topic


@answer_from_fresh_caches
@transaction.atomic
def create_topic(snapshot: AccessSnapshot, path: str, keywords: tuple[str, ...] | None = None,
                 link_path: str | None = None) -> Topic:
    """CREATE TOPIC; reply codes per profile §7. A topic the account may not see answers
    as a missing one (§4.1.3), as a path, a parent or a link's destination; only an account
    that could create the path (manage right on its parent) learns that it is taken. A link
    needs the subscribe right on its destination: it delivers what is published there."""
    _check_new_path(path)
    existing = find(path)
    if existing is not None and snapshot.can_see(existing):
        raise conflict("topic exists")
    parent = _parent_for(snapshot, path)
    link = None
    if link_path is not None:
        if paths.path_key(link_path) == paths.path_key(path):
            raise conflict("topic and destination topic are the same")
        link = find(link_path)
        if link is None or link.state != Topic.State.ACTIVE or not snapshot.can_see(link):
            raise not_found("destination topic")
        if link.is_virtual:
            raise not_allowed("a virtual topic links only to a real topic")
    _require_manage(snapshot, parent, "create topics")
    if existing is not None:
        raise conflict("topic exists")
    if link is not None and not snapshot.allows(link, Right.SUBSCRIBE):
        raise unauthorized(f"no subscribe right on {link.path}")
    siblings = Topic.objects.filter(parent=parent).count()
    if siblings >= settings.SMQP_MAX_CHILD_TOPICS:
        raise too_large("too many topics for parent topic")
    try:
        with transaction.atomic():
            topic = Topic.objects.create(path=path, parent=parent, link=link)
    except IntegrityError as exc:  # created concurrently
        raise conflict("topic exists") from exc
    if keywords:
        _set_keywords(topic, keywords)
    _notify_topic(topic, "ADDED")
    return topic


# --------------------------------------------------------------------------------- REMOVE


def _guard_account_topic(topic: Topic, what: str) -> None:
    if topic.account_id is not None or topic.key == paths.ACCOUNTS_ROOT:
        raise not_allowed(f"account topics cannot be {what} by commands")


@answer_from_fresh_caches
@transaction.atomic
def remove_topic(snapshot: AccessSnapshot, path: str) -> int:
    """REMOVE TOPIC: the topic and everything below it (and virtual topics linking there)
    stop taking publishes at once; they are deleted when their last pending message is gone.
    Returns the number of messages pending."""
    topic = get_visible(snapshot, path)
    _guard_account_topic(topic, "removed")
    if _descendants(topic.key).filter(account__isnull=False).exists():
        raise not_allowed("account topics cannot be removed by commands")
    _require_manage(snapshot, topic, "remove topics")
    subtree = Topic.objects.filter(Q(pk=topic.pk) | Q(key__startswith=topic.key + "/"))
    subtree_ids = list(subtree.values_list("pk", flat=True))
    links = Topic.objects.filter(link_id__in=subtree_ids).exclude(pk__in=subtree_ids)
    affected = list(subtree) + list(links)
    Topic.objects.filter(pk__in=[t.pk for t in affected]).update(state=Topic.State.REMOVING)
    topic_tree.changed()  # update() sends no signals
    pending = Message.objects.filter(
        topic_id__in=subtree_ids, state=Message.State.PENDING).count()
    for t in affected:
        _notify_topic(t, "DELETED")
    # Their MESSAGE subscriptions end, and their accounts are told (profile §9.3).
    _end_subscriptions([t.key for t in affected])
    if pending == 0:
        finalize_removal(topic_ids=[t.pk for t in affected])
    return pending


def _end_subscriptions(topic_keys: list[str]) -> int:
    """REMOVE TOPIC: the MESSAGE subscriptions on these topics (by name; each with its
    subtree, ``/t/*`` included) end, inside the caller's transaction; their accounts are
    told once it commits. Wildcards above a removed topic stay (they cover others).
    Returns how many ended."""
    if not topic_keys:
        return 0
    named = Q()
    for key in topic_keys:
        named |= Q(pattern_key=key) | Q(pattern_key__startswith=key + "/")
    ended = list(Subscription.objects.filter(named, resource=Subscription.Resource.MESSAGE)
                 .values_list("pk", "account_id", "pattern"))
    Subscription.objects.filter(pk__in=[pk for pk, _, _ in ended]).delete()
    for _, account_id, pattern in ended:
        notify.send_after_commit(
            [account_id], notify.subscription_cancelled_event(pattern, notify.REMOVED))
    return len(ended)


def finalize_removal(topic_ids: list[int] | None = None) -> int:
    """Delete topics marked for removal whose queues hold no pending message any more
    (leaves first). Returns how many topics were deleted."""
    qs = Topic.objects.filter(state=Topic.State.REMOVING)
    if topic_ids is not None:
        qs = qs.filter(pk__in=topic_ids)
    deleted = 0
    # Deepest first, so a parent goes only after its children; virtual links before targets.
    for topic in sorted(qs, key=lambda t: (t.link_id is None, -t.depth)):
        with transaction.atomic():
            busy = Message.objects.filter(
                Q(topic=topic) | Q(topic__key__startswith=topic.key + "/"),
                state=Message.State.PENDING,
            ).exists()
            if busy or topic.virtual_topics.exclude(state=Topic.State.REMOVING).exists():
                continue
            if Topic.objects.filter(parent=topic).exclude(state=Topic.State.REMOVING).exists():
                continue
            Topic.objects.filter(link=topic).delete()
            topic.delete()
            deleted += 1
    return deleted


# ---------------------------------------------------------------------------- SET TOPIC ...


@answer_from_fresh_caches
@transaction.atomic
def rename_topic(snapshot: AccessSnapshot, path: str, new_path: str) -> Topic:
    """SET TOPIC NAME: the topic (and its subtree) takes the new path; pending messages stay
    with it; the old name is gone at once."""
    topic = get_visible(snapshot, path)
    _guard_account_topic(topic, "renamed")
    if paths.path_key(new_path) == topic.key:
        raise conflict("new topic and topic are the same")
    _check_new_path(new_path)
    existing = find(new_path)  # hidden: as missing, up to the rights (see create_topic)
    if existing is not None and snapshot.can_see(existing):
        raise conflict("new topic exists")
    if paths.path_key(new_path).startswith(topic.key + "/"):
        raise conflict("a topic cannot move below itself")
    if _descendants(topic.key).filter(account__isnull=False).exists():
        raise not_allowed("account topics cannot be renamed by commands")
    new_parent = _parent_for(snapshot, new_path)
    _require_manage(snapshot, topic, "rename topics")
    _require_manage(snapshot, new_parent, "create topics")
    if existing is not None:
        raise conflict("new topic exists")
    old_path, old_key = topic.path, topic.key
    watchers_key = old_key
    topic.path = new_path
    topic.parent = new_parent
    topic.save()
    for child in _descendants(old_key):
        child.path = new_path + child.path[len(old_path):]
        child.save(update_fields=["path", "key", "updated"])
    old = Topic(path=old_path, key=old_key, link=topic.link)
    _notify_topic(old, "RENAME", new_path, key=watchers_key)
    return topic


@answer_from_fresh_caches
@transaction.atomic
def set_keywords(snapshot: AccessSnapshot, path: str, keywords: tuple[str, ...]) -> Topic:
    """SET TOPIC KEYWORD: replace the topic's keywords."""
    topic = get_visible(snapshot, path)
    _require_manage(snapshot, topic, "change keywords")
    _set_keywords(topic, keywords)
    _notify_topic(topic, "KEYWORDS", ",".join(keywords_of(topic)))
    return topic


def keywords_of(topic: Topic) -> list[str]:
    return list(topic.keywords.order_by("position").values_list("keyword", flat=True))


@answer_from_fresh_caches
def get_keywords(snapshot: AccessSnapshot, path: str) -> list[str]:
    return list(visible_node(snapshot, path).keywords)


@answer_from_fresh_caches
def find_topics(snapshot: AccessSnapshot, pattern: TopicPattern,
                keywords: tuple[str, ...] | None) -> list[tuple[Node, list[str]]]:
    """FIND TOPIC: topics each query keyword is a case-insensitive substring of a keyword
    of; ``/t/*`` searches every topic below ``/t``, ``/t (kw)`` the topic and its children
    (the draft's example finds ``/stocks/ibm`` by ``/stocks (BLUE)``), ``/t`` the topic."""
    wanted = [k.casefold() for k in keywords or ()]
    if pattern.wildcard or not wanted:
        searched = matching_topics(snapshot, pattern)
    else:
        top = [] if pattern.base in ("", "/") else [visible_node(snapshot, pattern.base)]
        searched = [*top, *_children(snapshot, pattern.base or "/")]
    return [(t, list(t.keywords)) for t in searched
            if all(any(w in k.casefold() for k in t.keywords) for w in wanted)]


# ------------------------------------------------------------------------ queue parameters

#: What :func:`set_parameters` changes: the delivery mode and the queue parameters.
PARAMETERS = ("delivery_mode", "expiry_timeout", "retry_timeout", "max_retries",
              "max_message_count", "max_message_size", "max_queue_bytes")


@answer_from_fresh_caches
@transaction.atomic
def set_parameters(snapshot: AccessSnapshot, path: str, changes: dict) -> Topic:
    """A topic's delivery mode and queue parameters (None: as its parent). The modify
    right on the topic is needed (401; 404 for a topic the account cannot see); a virtual
    topic has its real topic's (405)."""
    topic = get_visible(snapshot, path)
    if topic.is_virtual:
        raise not_allowed("a virtual topic has the parameters of its real topic")
    _require(snapshot, topic, Right.MODIFY)
    fields = []
    for name, value in changes.items():
        if name not in PARAMETERS:
            raise bad_request(f"no parameter {name}")
        if name == "delivery_mode":
            if value not in Topic.DeliveryMode.values:
                raise bad_request("delivery mode is fanout or queue")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < (-1 if name == "expiry_timeout" else 0)
                                    or value > 2**31 - 1):
            raise bad_request(f"{name} out of range")
        setattr(topic, name, value)
        fields.append(name)
    if fields:
        topic.save(update_fields=[*fields, "updated"])
    return topic
