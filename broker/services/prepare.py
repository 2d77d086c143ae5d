"""One publish checked and made a row (profile §8): where it goes (its topic, or for PUB REPLY
the original publisher's account topic), whether the account may publish there, the topic's
size limit, and the header values as stored. Nothing is written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from broker.domain import message as codec
from broker.domain.values import (
    format_datetime,
    parse_bool,
    parse_datetime,
    parse_int,
    parse_reply_smuid,
    parse_timeout,
)
from broker.models import Message
from broker.store.messages import NewMessage
from topics.models import Topic
from topics.tree import Node
from ual.models import Right
from ual.resolution import AccessSnapshot

from . import bad_request, conflict, not_found, too_large, unauthorized
from . import topics as topic_service
from .deliveries import effective


@dataclass
class PublishRequest:
    """One PUB MESSAGE / PUB REPLY as the door received it."""

    account_id: int
    guid: str
    kind: str  # "MESSAGE" or "REPLY"
    topic: str
    cmuid: str
    message: codec.Message
    peer: str = ""
    #: Which door took it, for the usage reports: "smqp", "xmpp", "rest", "qqp", "console",
    #: "federation".
    door: str = "smqp"
    #: QQP: the item's ResourceID. Claimed in the batch's transaction: stored at most once
    #: per publisher within ``SMQP_QQP_DEDUP_DAYS``; a replay's result is a
    #: :class:`.qqp_resources.Redundant`.
    resource_id: str | None = None


#: Written by a server that stores a forwarded message (:mod:`.federation`), never taken from
#: a publisher: a forged origin would make the real message a "duplicate" elsewhere.
_FEDERATION_HEADERS = frozenset({"x-origin", "x-route"})


def prepare(snapshot: AccessSnapshot, req: PublishRequest,
            now: datetime) -> tuple[Topic | Node, NewMessage]:
    """The topic a publish goes to and its row; raises the ServiceError that refuses it
    (a header that does not parse: ValueError)."""
    msg = req.message
    original = None
    if req.kind == "REPLY":
        topic, original = _reply_target(snapshot, req)
    else:
        found = topic_service.node(req.topic)
        if found is None or found.state != Topic.State.ACTIVE or not snapshot.can_see(found):
            raise not_found("topic")
        topic = found.resolved()
        if topic.state != Topic.State.ACTIVE:
            raise not_found("topic")
        if not snapshot.allows(found, Right.PUBLISH):
            raise unauthorized(f"no publish right on {found.path}")
    params = effective(topic)
    size = sum(len(s.body) for s in msg.sections)
    limit = params["max_message_size"]
    if limit is not None and size > limit:
        raise too_large(f"message of {size} bytes; {topic.path} takes at most {limit}")
    timeout_hdr = msg.get("Timeout")
    timeout = parse_timeout(timeout_hdr) if timeout_hdr else params["expiry_timeout"]
    priority = msg.get("Priority")
    sequence = msg.get("Sequence")
    created = msg.get("Created")
    row = NewMessage(
        topic_id=topic.pk,
        publisher_id=req.account_id,
        publisher_guid=req.guid,
        cmuid=req.cmuid[:200],
        name=(msg.get("Name") or "")[:128],
        priority=parse_int(priority, minimum=1, what="Priority: a whole number from 1")
        if priority else None,
        created=parse_datetime(created) if created else now,
        timeout=timeout,
        depth=parse_int(msg.get("Depth") or "0", minimum=-1,
                        what="Depth: a whole number from -1"),
        sequence=parse_int(sequence, minimum=1, what="Sequence: a whole number from 1")
        if sequence else None,
        receipt=parse_bool(msg.get("Receipt") or "NO"),
        reply=parse_bool(msg.get("Reply") or "NO"),
        in_reply_to_id=original.pk if original is not None else None,
        headers=_stored_headers(req, now),
        size=size,
        sections=msg.sections,
    )
    return topic, row


def _reply_target(snapshot: AccessSnapshot, req: PublishRequest) -> tuple[Topic, Message]:
    """PUB REPLY (profile §9.1): the reply goes to the account topic of the original's
    publisher, the original being the message its ``Smuid:`` names, on the reply's topic. The
    replier needs the reply right there and must be able to receive the original (404
    otherwise, as for an original that does not exist); a ``Cmuid:`` header must be the
    original's (409). The target is never taken from ``Cmuid:``."""
    found = topic_service.node(req.topic)
    if found is None or found.state != Topic.State.ACTIVE or not snapshot.can_see(found):
        raise not_found("topic")
    if not snapshot.allows(found, Right.REPLY):
        raise unauthorized(f"no reply right on {found.path}")
    smuid_hdr = req.message.get("Smuid")
    if not smuid_hdr:
        raise bad_request("PUB REPLY needs the Smuid of the original")
    number = parse_reply_smuid(smuid_hdr)
    # ``other.server/23`` is that server's message 23, never ours: as a missing original.
    # The host is a domain name (and its context path), compared without case.
    host = smuid_hdr.strip().rpartition("/")[0]
    original = None
    if not host or host.casefold() == settings.SMQP_SERVER_CONTEXT.casefold():
        original = (Message.objects.filter(pk=number, topic_id=found.resolved().pk)
                    .exclude(state=Message.State.DELETED).select_related("publisher").first())
    # An original the replier could not receive is not told apart from a missing one.
    if original is None or not snapshot.allows(found, Right.SUBSCRIBE):
        raise not_found("original message")
    cmuid_hdr = req.message.get("Cmuid")
    if cmuid_hdr is not None and not _same_cmuid(cmuid_hdr, original):
        raise conflict("Cmuid is not the original message's")
    target = None
    if original.publisher_id is not None:
        target = Topic.objects.filter(account_id=original.publisher_id).first()
    if target is None:
        raise not_found("original publisher")
    return target, original


def _same_cmuid(header: str, original: Message) -> bool:
    """Is ``header`` the original's Cmuid as delivered (``account/guid/token``, as
    :func:`.read.load_for_delivery` writes it; the account name in any case)?"""
    publisher = original.publisher.username if original.publisher else "system"
    account, _, rest = header.strip().partition("/")
    return (account.casefold() == publisher.casefold()
            and rest == f"{original.publisher_guid or publisher}/{original.cmuid}")


def _stored_headers(req: PublishRequest, now: datetime) -> list[tuple[str, str]]:
    """The header as stored: as sent, with Created filled in when missing; a reply's Smuid and
    Cmuid (naming the message it answers) are kept as X-Reply-Smuid / X-Reply-Cmuid."""
    headers: list[tuple[str, str]] = []
    for name, value in req.message.headers:
        if name.casefold() in _FEDERATION_HEADERS:
            continue  # the federation writes them (profile §9.5); a publisher may not forge
        if name == "Smuid":
            headers.append(("X-Reply-Smuid", value))
        elif name == "Cmuid":
            headers.append(("X-Reply-Cmuid", value))
        else:
            headers.append((name, value))
    if req.message.get("Created") is None:
        headers.insert(0, ("Created", format_datetime(now)))
    return headers
