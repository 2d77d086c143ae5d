"""User Access Lists. ``ual.check(account, topic, right)`` is the one question every door asks
(through the services layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accounts.models import Account
    from topics.models import Topic


def check(account: Account, topic: Topic, right: str) -> bool:
    """May ``account`` exercise ``right`` on ``topic``? Decided from the account's cached
    access snapshot (:func:`ual.resolution.snapshot_for`); see :mod:`ual.resolution`."""
    from .resolution import snapshot_for

    return snapshot_for(account).allows(topic, right)
