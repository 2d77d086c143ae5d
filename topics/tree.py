"""The topic tree held in memory, per process.

Reads of the tree (LIST, FIND, COUNT, visibility, the publish path's topic lookup and queue
parameters) are served from here without a query. Any change to a topic or its keywords bumps
a generation: at once in this process (after commit), and for every other process through a
counter in the shared cache (Redis), which each process reads at most every half second. So a
change is seen here immediately and everywhere within about half a second.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from broker import generations

GENERATION_KEY = "topics:generation"
POLL_SECONDS = settings.SMQP_CACHE_POLL_SECONDS


@dataclass(eq=False)
class Node:
    """A topic as the tree holds it; quacks like :class:`topics.models.Topic` for reads."""

    pk: int
    path: str
    key: str
    parent_id: int | None
    link_id: int | None
    account_id: int | None
    state: str
    delivery_mode: str
    params: dict[str, int | None]
    keywords: list[str] = field(default_factory=list)
    link: Node | None = None
    virtual_ids: list[int] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.pk

    @property
    def is_virtual(self) -> bool:
        return self.link_id is not None

    def resolved(self) -> Node:
        return self.link if self.link is not None else self

    def __str__(self) -> str:
        return f"{self.path} > {self.link.path}" if self.link is not None else self.path


class TopicTree:
    def __init__(self, nodes: list[Node]) -> None:
        self.by_id = {n.pk: n for n in nodes}
        self.by_key = {n.key: n for n in nodes}
        self.children: dict[int | None, list[Node]] = {}
        for node in sorted(nodes, key=lambda n: n.key):
            self.children.setdefault(node.parent_id, []).append(node)
            if node.link_id is not None:
                node.link = self.by_id.get(node.link_id)
                if node.link is not None:
                    node.link.virtual_ids.append(node.pk)
        self.sorted_keys = sorted(self.by_key)
        # effective(), per topic: the tree never changes (a change builds a new one).
        self._effective: dict[int, tuple[object, dict[str, int | None]]] = {}

    def find(self, key: str) -> Node | None:
        return self.by_key.get(key)

    def descendants(self, key: str) -> list[Node]:
        """Every topic below ``key`` (all depths), in key order."""
        import bisect

        prefix = key.rstrip("/") + "/"
        keys = self.sorted_keys
        i = bisect.bisect_left(keys, prefix)
        out = []
        while i < len(keys) and keys[i].startswith(prefix):
            out.append(self.by_key[keys[i]])
            i += 1
        return out

    def effective(self, node: Node) -> dict[str, int | None]:
        """Queue parameters: the topic's own, else the nearest ancestor's, else the server's.
        Computed once per topic (a publish asks for every message): read it, never change
        it."""
        defaults = settings.SMQP_QUEUE_DEFAULTS
        known = self._effective.get(node.pk)
        if known is not None and known[0] is defaults:
            return known[1]
        result = dict(defaults)
        chain = []
        current: Node | None = node
        while current is not None:
            chain.append(current)
            current = self.by_id.get(current.parent_id) if current.parent_id else None
        for name in result:
            for n in chain:
                if n.params.get(name) is not None:
                    result[name] = n.params[name]
                    break
        self._effective[node.pk] = (defaults, result)
        return result


_lock = threading.Lock()
_tree: TopicTree | None = None
_local_generation = 0
_loaded_local = -1
_loaded_shared: int | None = None
_checked_at = 0.0


def _shared_generation() -> int | None:
    try:
        return generations.read(GENERATION_KEY)
    except Exception:  # the cache being away must not stop reads; reload instead
        return None


def _load() -> TopicTree:
    from .models import QUEUE_PARAMETERS, Topic, TopicKeyword

    keywords: dict[int, list[str]] = {}
    for topic_id, keyword in TopicKeyword.objects.order_by("topic", "position").values_list(
            "topic_id", "keyword"):
        keywords.setdefault(topic_id, []).append(keyword)
    fields = ("pk", "path", "key", "parent_id", "link_id", "account_id", "state",
              "delivery_mode", *QUEUE_PARAMETERS)
    nodes = []
    for row in Topic.objects.values_list(*fields):
        values = dict(zip(fields, row, strict=True))
        nodes.append(Node(
            pk=values["pk"], path=values["path"], key=values["key"],
            parent_id=values["parent_id"], link_id=values["link_id"],
            account_id=values["account_id"], state=values["state"],
            delivery_mode=values["delivery_mode"],
            params={name: values[name] for name in QUEUE_PARAMETERS},
            keywords=keywords.get(values["pk"], []),
        ))
    return TopicTree(nodes)


def tree() -> TopicTree:
    """The current tree (reloaded when this or another process changed topics)."""
    global _tree, _loaded_local, _loaded_shared, _checked_at
    with _lock:
        now = time.monotonic()
        stale = _tree is None or _loaded_local != _local_generation
        if not stale and now - _checked_at >= POLL_SECONDS:
            _checked_at = now
            stale = _shared_generation() != _loaded_shared
        if stale:
            _loaded_local = _local_generation
            _loaded_shared = _shared_generation()
            _checked_at = now
            _tree = _load()
        return _tree


def recheck() -> bool:
    """Read the shared generation now (not a poll interval later): True when another
    process changed topics since this one loaded its tree, which is then loaded again on
    its next use. For an answer that says a topic does not exist: checked before it is
    given, it holds even for a topic made a moment ago elsewhere."""
    global _local_generation
    shared = _shared_generation()
    with _lock:
        if _tree is None or shared == _loaded_shared:
            return False
        # Stale: tree() loads it again, and a storage process follows (local_generation).
        _local_generation += 1
        return True


def changed() -> None:
    """Call after a topic or keyword change: here at once, elsewhere via the shared counter
    (both after the transaction commits, so nobody caches the old state as new)."""

    def bump_local() -> None:
        global _local_generation
        with _lock:
            _local_generation += 1

    def bump() -> None:
        bump_local()
        # Unreachable: other processes fall back to their next poll of a reachable cache.
        with contextlib.suppress(Exception):
            generations.bump(GENERATION_KEY)

    # At once as well: the changing thread then reads its own writes inside the transaction;
    # a reload by another thread before the commit is undone by the bump after it.
    bump_local()
    transaction.on_commit(bump)


def local_generation() -> int:
    """Counts this process's own topic changes (a storage process follows it:
    :mod:`broker.store.lanes`)."""
    return _local_generation


def invalidate_local() -> None:
    """Load the tree again on its next use (the listener changed it:
    :mod:`broker.store.lanes`)."""
    global _local_generation
    with _lock:
        _local_generation += 1


def reset() -> None:
    """Forget the loaded tree (tests whose transactions roll back call this)."""
    global _tree
    with _lock:
        _tree = None
