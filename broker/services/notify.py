"""What the services announce: notifications to subscribed accounts (NOTIFY TOPIC / SUB /
SERVER), and committed messages to the dispatchers that deliver them.

Services decide who is told what; the events travel, after the transaction commits, through
the Channels layer: notifications to the group ``account-<id>`` that every live session of an
account joins, in whichever listener process it runs (doors turn them into their own wire
form); committed messages to the dispatch group every listener's dispatcher reads
(:func:`messages_committed`). Services never import a door or the dispatcher: this module is
how they reach them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("broker.notify")


def account_group(account_id: int) -> str:
    return f"account-{account_id}"


def _send(account_ids: Iterable[int], event: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for account_id in set(account_ids):
        try:
            async_to_sync(layer.group_send)(account_group(account_id), event)
        except Exception:  # a notification is best-effort; the change itself is committed
            logger.exception("could not send %s to account %s", event.get("kind"), account_id)


def send_after_commit(account_ids: Iterable[int], event: dict) -> None:
    ids = list(set(account_ids))
    if ids:
        transaction.on_commit(lambda: _send(ids, event))


def topic_event(topic_path: str, action: str, value: str | None = None) -> dict:
    return {"type": "smqp.notify", "kind": "topic", "topic": topic_path, "action": action,
            "value": value}


def subscribers_event(topic_path: str, count: int) -> dict:
    return {"type": "smqp.notify", "kind": "sub", "topic": topic_path, "count": count}


def server_timeout_event(seconds: int) -> dict:
    return {"type": "smqp.notify", "kind": "server_timeout", "timeout": seconds}


#: Why a subscription ended other than by its account's UNSUB (profile §9.3).
LEASE, REVOKED, REMOVED = "lease", "revoked", "removed"


def subscription_cancelled_event(pattern: str, reason: str) -> dict:
    """A MESSAGE subscription on ``pattern`` ended (``reason``: :data:`LEASE`,
    :data:`REVOKED` or :data:`REMOVED`); every live session of the account is told (SMQP:
    ``NOTIFY SUBSCRIPTION <pattern>`` / ``Action: CANCELLED`` / ``Reason: <reason>``)."""
    return {"type": "smqp.notify", "kind": "subscription", "pattern": pattern,
            "action": "CANCELLED", "reason": reason}


# ------------------------------------------------------------------ committed messages

#: The Channels group every listener's dispatcher reads (``broker.delivery``): a
#: ``dispatch.wake`` event there offers messages to the subscriber sessions of each process.
DISPATCH_GROUP = "smqp-dispatch"


class Committed(Protocol):
    """What a wake-up says of a committed message (the services' ``Published``)."""

    smuid: int
    priority: int
    accounts: list[int]


def messages_committed(published: Iterable[Committed]) -> None:
    """Announce messages committed outside a listener's group commit (a sweep, a journal
    recovery, a single publish or ACK) to the subscriber sessions of every process: one
    ``dispatch.wake`` event on :data:`DISPATCH_GROUP`. Call it once they are committed
    (inside a transaction: :func:`messages_committed_on_commit`). Best-effort, as every
    wake-up: a lost one is made up for by the dispatchers' backlog sweeps."""
    layer = get_channel_layer()
    if layer is None:
        return
    items = [[p.priority, p.smuid, p.accounts] for p in published if p.accounts]
    if items:
        with contextlib.suppress(Exception):
            async_to_sync(layer.group_send)(
                DISPATCH_GROUP, {"type": "dispatch.wake", "origin": "", "items": items,
                                 "at": time.time()})


def deliveries_withdrawn(pairs: Iterable[tuple[int, int]]) -> None:
    """Queue mode: these (account, smuid) deliveries were moved to another account (a sweep):
    the account's sessions, in every process, need not try to send them (their lock would
    fail, a database round trip each). One ``dispatch.withdraw`` event on
    :data:`DISPATCH_GROUP`. Best-effort: a session that tries all the same does not get the
    lock."""
    layer = get_channel_layer()
    items = [[account_id, smuid] for account_id, smuid in pairs]
    if layer is not None and items:
        with contextlib.suppress(Exception):
            async_to_sync(layer.group_send)(
                DISPATCH_GROUP, {"type": "dispatch.withdraw", "origin": "", "items": items})


def messages_committed_on_commit(published: list[Committed]) -> None:
    """:func:`messages_committed` once the current transaction commits (at once outside
    one), as Zulip's ``send_event_on_commit``."""
    if any(p.accounts for p in published):
        transaction.on_commit(lambda: messages_committed(published))


def close_session_event(guid: str) -> dict:
    """An operator closes the session with this guid (``broker.services.stats``): the
    account's sessions get it, and the one with the guid says BYE and disconnects."""
    return {"type": "smqp.notify", "kind": "close", "guid": guid}
