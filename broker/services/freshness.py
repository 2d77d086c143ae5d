"""A refusal is given from fresh caches only.

Every process caches the topic tree and the access snapshots, and hears of a change made
elsewhere (a topic created by another listener, a right granted in the admin) at its next
poll of the shared change counters. A refusal that may come from such a cache a moment
behind (401: no right; 404: no topic) is therefore checked once more: the counters are read
now, and if they moved the caches are dropped and the question is answered again. This rule
lives here only: every door gets it through the service functions
(:func:`answer_from_fresh_caches`), the publish batch through :func:`caches_were_stale`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from topics import tree as topic_tree
from ual import resolution as ual_resolution
from ual.resolution import AccessSnapshot, snapshot_for

from . import Refusal, ServiceError

#: Refusals that may come from caches a moment behind another process's change: given only
#: once :func:`caches_were_stale` says the caches were current.
REFUSALS = (Refusal.UNAUTHORIZED, Refusal.NOT_FOUND)

P = ParamSpec("P")
T = TypeVar("T")


def caches_were_stale() -> bool:
    """Had this process's topic tree or access snapshots missed a change made elsewhere?
    Both shared change counters are read now (not at the next poll); stale caches are
    dropped, so the next use reads the database."""
    trees = topic_tree.recheck()
    return ual_resolution.recheck() or trees


def is_refusal(result: Any) -> bool:
    """Is ``result`` a refusal that fresh caches might not give (:data:`REFUSALS`)?"""
    return isinstance(result, ServiceError) and result.refusal in REFUSALS


def answer_from_fresh_caches(
        fn: Callable[Concatenate[AccessSnapshot, P], T],
) -> Callable[Concatenate[AccessSnapshot, P], T]:
    """``fn(snapshot, ...)``, a service function that changes nothing before it decides to
    refuse: a refusal (:data:`REFUSALS`) made from stale caches is not given, ``fn`` runs
    again with the account's fresh snapshot and answers. Outermost, around any
    ``transaction.atomic``: the second run is a transaction of its own."""

    @functools.wraps(fn)
    def answered(snapshot: AccessSnapshot, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(snapshot, *args, **kwargs)
        except ServiceError as exc:
            if not is_refusal(exc) or not caches_were_stale():
                raise
        return fn(snapshot_for(snapshot.account), *args, **kwargs)

    return answered
