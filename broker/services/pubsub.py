"""The rules of XMPP publish-subscribe (XMPP-PROFILE §3, §4) that SMQP has no verb for:
item ids, node configuration (``pubsub#queueing`` is the delivery mode ``queue``), item
retrieval and retraction, and the state of a queue item for XEP-0254's errors. Publishing,
subscribing and the queue locks are the same services SMQP uses.

Item ids: a publisher's own id is kept as the message's Cmuid with :data:`ITEM_PREFIX` (so
publishing it again finds and replaces the item); any other message's item id is its smuid.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from broker.domain import message as codec
from broker.domain.values import TopicPattern
from broker.models import Delivery, Message
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import Refusal, ServiceError, bad_request, not_found, notify, unauthorized
from . import subscriptions as subscription_service
from . import topics as topic_service
from .freshness import answer_from_fresh_caches
from .read import load_for_delivery
from .removal import trash_messages

ITEM_PREFIX = "xmpp-item:"
QUEUEING = "pubsub#queueing"
QUEUE_REQUESTS = "pubsub#queue_requests"
# Subscribe options beside queue_requests (SMQP-PROFILE §9.2, §9.3): the selector as
# ``<class> <text>`` and XEP-0060's leased-subscription end (an xs:dateTime; a bare number
# of seconds is taken too, as SMQP's LEASE).
SELECTOR = "pubsub#selector"
EXPIRE = "pubsub#expire"
# Node configuration fields → the topic's queue parameters (pubsub#queueing aside).
PARAMETERS = {
    "pubsub#item_expire": "expiry_timeout",
    "pubsub#max_items": "max_message_count",
    "pubsub#max_payload_size": "max_message_size",
    "smqp#retry_timeout": "retry_timeout",
    "smqp#max_retries": "max_retries",
    "smqp#max_queue_bytes": "max_queue_bytes",
}
# Items given back by one ``items`` request at most (XEP-0060 lets a service cap them).
MAX_ITEMS = 1000
# The longest lease a subscribe option may ask for (ten years: a typo, not a lease, beyond).
MAX_LEASE = 10 * 365 * 86400


class OptionsRequired(ServiceError):
    """XEP-0254 §2.1: a queue node's subscription needs ``pubsub#queue_requests``."""

    def __init__(self) -> None:
        super().__init__(Refusal.OPTIONS_REQUIRED,
                         Refusal.OPTIONS_REQUIRED.text("pubsub#queue_requests required"))


def new_cmuid(item_id: str | None) -> str:
    """The Cmuid an XMPP publish is stored under."""
    return ITEM_PREFIX + item_id if item_id else f"xmpp-{uuid.uuid4().hex}"


def item_id_of(cmuid: str, smuid: int) -> str:
    """A message's item id from its Cmuid (stored, or the ``account/guid/cmuid`` header the
    delivery layer gives)."""
    if not cmuid.startswith(ITEM_PREFIX):
        cmuid = cmuid.split("/", 2)[-1]
    return cmuid[len(ITEM_PREFIX):] if cmuid.startswith(ITEM_PREFIX) else str(smuid)


def is_item(cmuid: str) -> bool:
    """Was the message published as an XMPP item (its payload one XML element)?"""
    if not cmuid.startswith("xmpp-"):
        cmuid = cmuid.split("/", 2)[-1]
    return cmuid.startswith("xmpp-")


def _pending(topic: Topic | Node) -> QuerySet[Message]:
    """The items of a (real) topic: its pending messages; on a queue node only those not
    consumed yet (a consumed message stays pending until its expiry timeout)."""
    qs = Message.objects.filter(topic_id=topic.pk, state=Message.State.PENDING)
    if is_queue(topic):
        qs = qs.exclude(Exists(Delivery.objects.filter(
            message_id=OuterRef("pk"), state__in=[Delivery.State.ACKED, Delivery.State.DEAD])))
    return qs


def _find_items(topic: Topic | Node, item_ids: list[str]) -> dict[str, int]:
    """item id → smuid of the items of a (real) topic."""
    found: dict[str, int] = {}
    named = _pending(topic).filter(cmuid__in=[ITEM_PREFIX + i for i in item_ids]).order_by("pk")
    for pk, cmuid in named.values_list("pk", "cmuid"):
        found[cmuid[len(ITEM_PREFIX):]] = pk  # the newest wins
    numbers = [int(i) for i in item_ids if i not in found and i.isdigit() and len(i) < 19]
    if numbers:
        plain = _pending(topic).filter(pk__in=numbers).exclude(cmuid__startswith=ITEM_PREFIX)
        for pk in plain.values_list("pk", flat=True):
            found[str(pk)] = pk
    return found


def _real(snapshot: AccessSnapshot, path: str) -> tuple[Topic | Node, Topic | Node]:
    topic = topic_service.visible_node(snapshot, path)
    real = topic.resolved()
    if real.state != Topic.State.ACTIVE:
        raise not_found("topic")
    return topic, real


def is_queue(topic: Topic | Node) -> bool:
    return topic.resolved().delivery_mode == Topic.DeliveryMode.QUEUE


# ------------------------------------------------------------------ node configuration


def _config_fields(topic: Topic | Node) -> list[tuple[str, str, list[str]]]:
    fields = [(QUEUEING, "boolean", ["1" if is_queue(topic) else "0"])]
    for var, name in PARAMETERS.items():
        value = getattr(topic, name, None)
        fields.append((var, "text-single", [] if value is None else [str(value)]))
    return fields


@answer_from_fresh_caches
def node_config(snapshot: AccessSnapshot, path: str) -> list[tuple[str, str, list[str]]]:
    """The node configuration form's fields (var, type, values); the manage right."""
    topic, real = _real(snapshot, path)
    if not snapshot.allows(topic, Right.MANAGE):
        raise unauthorized(f"no manage right on {topic.path}")
    return _config_fields(Topic.objects.get(pk=real.pk))


def _parse_config(config: dict[str, list[str]]) -> dict[str, object]:
    changes: dict[str, object] = {}
    for var, values in config.items():
        value = values[0].strip() if values else ""
        if var == QUEUEING:
            if value.lower() not in ("1", "0", "true", "false"):
                raise bad_request(f"{var} is a boolean")
            changes["delivery_mode"] = (Topic.DeliveryMode.QUEUE if value.lower() in
                                        ("1", "true") else Topic.DeliveryMode.FANOUT)
        elif var in PARAMETERS:
            if value == "":
                changes[PARAMETERS[var]] = None  # as the parent topic
                continue
            try:
                number = int(value)
            except ValueError:
                raise bad_request(f"{var} is a number") from None
            if number < (-1 if var == "pubsub#item_expire" else 0) or number > 2**62:
                raise bad_request(f"{var} out of range")
            changes[PARAMETERS[var]] = number
        elif var != "FORM_TYPE":
            raise bad_request(f"unknown field {var[:80]}")
    return changes


@answer_from_fresh_caches
@transaction.atomic
def configure(snapshot: AccessSnapshot, path: str, config: dict[str, list[str]]) -> None:
    """Set the node configuration (the manage right); an unknown field or a bad value is
    refused (400) and nothing changes."""
    topic, real = _real(snapshot, path)
    if not snapshot.allows(topic, Right.MANAGE):
        raise unauthorized(f"no manage right on {topic.path}")
    changes = _parse_config(config)
    if not changes:
        return
    row = Topic.objects.select_for_update().get(pk=real.pk)
    for name, value in changes.items():
        setattr(row, name, value)
    row.save(update_fields=[*changes, "updated"])


@answer_from_fresh_caches
@transaction.atomic
def create_node(snapshot: AccessSnapshot, path: str, config: dict[str, list[str]]) -> Topic:
    """CREATE TOPIC with an optional configuration form, in one transaction."""
    changes = _parse_config(config)
    topic = topic_service.create_topic(snapshot, path)
    if changes:
        for name, value in changes.items():
            setattr(topic, name, value)
        topic.save(update_fields=[*changes, "updated"])
    return topic


# ------------------------------------------------------------------ subscriptions


@answer_from_fresh_caches
def subscribe(snapshot: AccessSnapshot, path: str,
              options: dict[str, list[str]] | None) -> int | None:
    """SUB MESSAGE on the node for the account (durable). On a queue node the options must
    hold ``pubsub#queue_requests`` ≥ 1 (:class:`OptionsRequired` else); it is returned (None
    on a fan-out node)."""
    topic, _ = _real(snapshot, path)
    requests = None
    if is_queue(topic):
        raw = (options or {}).get(QUEUE_REQUESTS)
        if not raw or not raw[0].strip():
            raise OptionsRequired()
        try:
            requests = int(raw[0])
        except ValueError:
            raise bad_request(f"{QUEUE_REQUESTS} is a number") from None
        if not 1 <= requests <= 10_000:
            raise bad_request(f"{QUEUE_REQUESTS} out of range")
    subscription_service.subscribe(snapshot, "MESSAGE", TopicPattern(topic.path, False),
                                   lease=lease_of(options), selector=selector_of(options))
    return requests


def _option(options: dict[str, list[str]] | None, var: str) -> str | None:
    raw = (options or {}).get(var)
    if not raw or not raw[0].strip():
        return None
    return raw[0].strip()


def selector_of(options: dict[str, list[str]] | None) -> tuple[str, str] | None:
    """``pubsub#selector`` = ``<class> <text>`` → (class, text) for
    :func:`broker.services.subscriptions.subscribe` (which compiles it: 566 / 567)."""
    value = _option(options, SELECTOR)
    if value is None:
        return None
    cls, _, text = value.partition(" ")
    if not text.strip():
        raise bad_request(f"{SELECTOR} is '<class> <selector text>'")
    return cls, text.strip()


def lease_of(options: dict[str, list[str]] | None, now: datetime | None = None) -> int | None:
    """``pubsub#expire`` → the lease in whole seconds (rounded up; 400 when it is not in
    the future). XEP-0060 §6.3.x gives it as an xs:dateTime; seconds are accepted too."""
    value = _option(options, EXPIRE)
    if value is None:
        return None
    if value.isascii() and value.isdigit():  # (str.isdigit alone takes "²")
        seconds = int(value)
    else:
        try:
            end = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise bad_request(f"{EXPIRE} is a date-time or a number of seconds") from None
        if end.tzinfo is None:
            end = end.replace(tzinfo=UTC)
        seconds = math.ceil((end - (now or datetime.now(UTC))).total_seconds())
    if not 0 < seconds <= MAX_LEASE:
        raise bad_request(f"{EXPIRE} must be in the future (and within {MAX_LEASE} s)")
    return seconds


# ------------------------------------------------------------------ items


@dataclass(frozen=True)
class Item:
    item_id: str
    smuid: int
    message: codec.Message
    xmpp_item: bool


@answer_from_fresh_caches
def items(snapshot: AccessSnapshot, path: str, max_items: int | None,
          item_ids: list[str]) -> list[Item]:
    """GET MESSAGE for pubsub: the node's pending items, the named ones or the latest
    ``max_items`` (at most :data:`MAX_ITEMS`), oldest first; the subscribe right."""
    topic, real = _real(snapshot, path)
    if not snapshot.allows(topic, Right.SUBSCRIBE):
        raise unauthorized(f"no subscribe right on {topic.path}")
    if item_ids:
        found = _find_items(real, item_ids)
        smuids = sorted(set(found.values()))
    else:
        limit = min(MAX_ITEMS, max_items if max_items is not None else MAX_ITEMS)
        smuids = sorted(_pending(real).order_by("-pk").values_list("pk", flat=True)[:limit])
    loaded = load_for_delivery(smuids)
    return [Item(item_id_of(loaded[m][1], m), m, loaded[m][2], is_item(loaded[m][1]))
            for m in smuids if m in loaded]


@answer_from_fresh_caches
@transaction.atomic
def retract(snapshot: AccessSnapshot, path: str, item_ids: list[str]) -> list[str]:
    """Remove items of a fan-out node into Trash: their publisher may, or the manage right.
    Every subscriber account is told (a retract notification). 404 when one is missing."""
    topic, real = _real(snapshot, path)
    found = _find_items(real, item_ids)
    missing = [i for i in item_ids if i not in found]
    if missing:
        raise not_found(f"item {missing[0][:80]}")
    smuids = sorted(set(found.values()))
    rows = Message.objects.select_for_update().filter(pk__in=smuids,
                                                      state=Message.State.PENDING)
    publishers = set(rows.values_list("publisher_id", flat=True))
    if publishers != {snapshot.account.pk} and not snapshot.allows(topic, Right.MANAGE):
        raise unauthorized(f"only the publisher or the manage right retracts on {topic.path}")
    trash_messages(snapshot.account.username, real.path, smuids)
    notify.send_after_commit(topic_service.subscriber_accounts(real),
                             retracted_event(real.path, item_ids))
    return item_ids


def retracted_event(topic_path: str, item_ids: list[str]) -> dict:
    return {"type": "smqp.notify", "kind": "xmpp_retract", "topic": topic_path,
            "ids": list(item_ids)}


def _others_items(snapshot: AccessSnapshot, topic: Topic | Node,
                  older: QuerySet[Message]) -> QuerySet[Message]:
    """Of ``older`` (pending items of the node), those the account may not retract: another
    publisher's, unless it holds the manage right (as :func:`retract` asks)."""
    if snapshot.allows(topic, Right.MANAGE):
        return older.none()
    return older.exclude(publisher_id=snapshot.account.pk)


@answer_from_fresh_caches
def check_replace(snapshot: AccessSnapshot, path: str, item_id: str) -> None:
    """Before publishing ``item_id`` again: replacing an item needs what retracting it
    needs (its publisher, or the manage right), else 401 (``forbidden``). A node the
    account may not see is left to the publish itself to refuse, as for a missing one."""
    topic = topic_service.node(path)
    if topic is None or not snapshot.can_see(topic):
        return
    real = topic.resolved()
    older = _pending(real).filter(cmuid=ITEM_PREFIX + item_id)
    if _others_items(snapshot, topic, older).exists():
        raise unauthorized(f"item {item_id[:80]} is another publisher's; only the manage "
                           f"right replaces it on {topic.path}")


def replace_older(snapshot: AccessSnapshot, topic_path: str, item_id: str,
                  smuid: int) -> None:
    """An item published again under its id replaces the one before (profile §3): the
    older pending messages with that id go into Trash once the new one is stored, those the
    account may retract only (:func:`check_replace` refused the publish when there were
    others'; one published meanwhile by another account stays)."""
    topic = topic_service.node(topic_path)
    if topic is None:
        return
    real = topic.resolved()
    with transaction.atomic():
        rows = Message.objects.select_for_update().filter(
            topic_id=real.pk, state=Message.State.PENDING, cmuid=ITEM_PREFIX + item_id,
            pk__lt=smuid)
        others = set(_others_items(snapshot, topic, rows).values_list("pk", flat=True))
        older = [pk for pk in rows.values_list("pk", flat=True) if pk not in others]
        trash_messages(snapshot.account.username, real.path, older)


# ------------------------------------------------------------------ queue items


def queue_item(path: str, item_id: str) -> tuple[int, str] | None:
    """A queue node's pending item: (smuid, the guid of the session holding its lock, or
    ""); None when there is no such item."""
    topic = topic_service.node(path)
    if topic is None:
        return None
    found = _find_items(topic.resolved(), [item_id])
    smuid = found.get(item_id)
    if smuid is None:
        return None
    holder = (Delivery.objects.filter(message_id=smuid, state=Delivery.State.NOTIFIED)
              .exclude(Q(holder="") | Q(holder__isnull=True))
              .values_list("holder", flat=True).first())
    return smuid, holder or ""
