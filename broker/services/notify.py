"""Notifications to subscribed accounts (NOTIFY TOPIC / SUB / SERVER).

Services decide who is told what; the events travel, after the transaction commits, through
the Channels layer to the group ``account-<id>`` that every live session of an account joins,
in whichever listener process it runs. Doors turn the events into their own wire form.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

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
