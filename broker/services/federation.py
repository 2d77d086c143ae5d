"""Federation between server domains (profile §9.5, draft §2.3): the rules, once.

A link is an SMQP client of its peer (the door: :mod:`broker.federation`). What it receives
there is accepted here: stored under ``/<link-name>/<peer's path>`` with ``X-Origin`` (the
first server's ``<context>/<smuid>``), ``X-Route`` (every server it passed, this one last)
and ``Depth`` lowered by one; dropped when its route already names this server (a loop),
when its origin is stored here already (a duplicate: another route, or sent again after a
broken link), when its Depth is spent, or when it is outside the link's imports. The origin
is recorded in the publish's own transaction, so the link's ``310 ACK`` (sent only after
that commit) never loses a message and a copy sent again is never stored twice.

The sending side's rules live with every other delivery (:mod:`.deliveries`): a peer's
account receives only with the ``remote`` right, and never a message whose Depth is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from broker.domain import message as codec
from broker.domain.errors import ProtocolError
from broker.domain.values import (
    TopicPattern,
    format_datetime,
    parse_bool,
    parse_datetime,
    parse_int,
    parse_smuid_header,
    parse_timeout,
    parse_topic_pattern,
    validate_topic,
)
from broker.models import Delivery, FederatedOrigin, Link, Subscription
from broker.store.messages import NewMessage
from topics import paths
from topics.models import Topic
from topics.tree import Node
from ual.resolution import AccessSnapshot

from . import ServiceError, bad_request, conflict, not_found, notify, too_large
from . import topics as topic_service
from .deliveries import effective, receive_right
from .publish import Published, publish_prepared

ORIGIN = "X-Origin"
ROUTE = "X-Route"
# Headers the sending server wrote for this delivery, or that this server writes anew.
_REPLACED = frozenset({"smuid", "cmuid", "topic", "depth", "x-origin", "x-route", "receipt"})


def own_context() -> str:
    """This server's context (draft §2.3): what routes and origins name it by."""
    return settings.SMQP_SERVER_CONTEXT


# ------------------------------------------------------------------------------ imports


def parse_imports(text: str) -> list[TopicPattern]:
    """A link's imports (``/news/*, /stocks/ibm``); ValueError for a bad pattern."""
    found = []
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            found.append(parse_topic_pattern(part))
        except ProtocolError as exc:
            raise ValueError(f"not a topic pattern: {part!r}") from exc
    return found


def _covers(outer: TopicPattern, inner: TopicPattern) -> bool:
    """Does ``outer`` name every topic ``inner`` does?"""
    if not outer.wildcard:
        return not inner.wildcard and paths.path_key(outer.base) == paths.path_key(inner.base)
    if outer.base == "/":
        return True
    okey, ikey = paths.path_key(outer.base), paths.path_key(inner.base)
    return ikey.startswith(okey + "/") or (inner.wildcard and ikey == okey)


def imported(peer_path: str, imports: list[TopicPattern]) -> bool:
    """May a message of the peer's topic ``peer_path`` be imported over this link?"""
    topic = TopicPattern(peer_path, False)
    return any(_covers(imp, topic) for imp in imports)


# ----------------------------------------------------------------------------- interest


def interest(link_name: str, imports: list[TopicPattern]) -> list[str]:
    """What the link must subscribe to on the peer: the MESSAGE subscriptions here below
    ``/<link-name>/`` (of any account, a peer's link included: interest travels on), with
    the prefix taken off, narrowed to the link's imports. ``/<link-name>/*`` wants all of
    them."""
    prefix = "/" + link_name
    rows = (Subscription.objects.filter(resource=Subscription.Resource.MESSAGE,
                                        pattern_key__startswith=prefix.casefold() + "/")
            .values_list("pattern", flat=True).distinct())
    wanted: dict[str, TopicPattern] = {}
    for pattern in rows:
        try:
            local = parse_topic_pattern(pattern)
        except ProtocolError:
            continue
        rest = local.base[len(prefix):]
        if not rest:
            narrowed = list(imports) if local.wildcard else []
        else:
            peer = TopicPattern(rest, local.wildcard)
            narrowed = []
            for imp in imports:
                if _covers(imp, peer):
                    narrowed.append(peer)
                elif _covers(peer, imp):
                    narrowed.append(imp)
        for p in narrowed:
            wanted.setdefault(str(p).casefold(), p)
    # One subscription per subtree: what another one covers is left out.
    found = list(wanted.values())
    kept = [p for p in found
            if not any(q is not p and _covers(q, p) for q in found)]
    return sorted((str(p) for p in kept), key=str.casefold)


# ----------------------------------------------------------------------------- accepting


@dataclass(frozen=True)
class Accepted:
    """What became of one forwarded message: its smuid here, or why it was dropped."""

    origin: str
    smuid: int | None = None
    dropped: str | None = None


def accept_forwarded(link_name: str, imports: list[TopicPattern], peer_topic: str,
                     message: codec.Message, peer: str = "") -> Accepted:
    """Store (or drop) one message the link received on the peer's topic ``peer_topic``,
    its header as the peer sent it (``Smuid: <peer-context>/<n>``, ``Cmuid``, ...). Once
    this returns, the link may ACK it. Raises ServiceError when it can be neither stored
    nor dropped (a limit of the topic here): the link does not ACK it then, and the peer
    sends it again after its retry timeout."""
    [result] = accept_forwarded_batch(link_name, imports, [(peer_topic, message)], peer)
    if isinstance(result, ServiceError):
        raise result
    return result


def accept_forwarded_batch(link_name: str, imports: list[TopicPattern],
                           items: list[tuple[str, codec.Message]],
                           peer: str = "") -> list[Accepted | ServiceError]:
    """:func:`accept_forwarded` of several messages (a link's window), in one transaction,
    stored in the order given: each one's ``Accepted``, or the ServiceError that keeps it
    from being stored or dropped (not to be ACKed). A copy of an origin stored here before,
    or earlier in the same list, is dropped as a duplicate."""
    results: list[Accepted | ServiceError | None] = [None] * len(items)
    # (index, origin, peer's path, the message as stored here, the peer's Cmuid)
    screened: list[tuple[int, str, str, codec.Message, str]] = []
    for i, (peer_topic, message) in enumerate(items):
        outcome = _screen(imports, peer_topic, message)
        if isinstance(outcome, Accepted):
            results[i] = outcome
        else:
            screened.append((i, outcome[0], peer_topic, outcome[1], message.get("Cmuid") or ""))
    if not screened:
        return results  # type: ignore[return-value]
    try:
        with transaction.atomic():
            _store_screened(link_name, screened, results, peer)
    except IntegrityError:
        # An origin stored meanwhile by another link (another route): each on its own, so
        # that only that copy is dropped as the second one.
        if len(items) == 1:
            origin = screened[0][1]
            if FederatedOrigin.objects.filter(origin=origin).exists():
                return [Accepted(origin, dropped="duplicate")]
            raise
        return [_one(link_name, imports, peer_topic, message, peer)
                for peer_topic, message in items]
    return results  # type: ignore[return-value]


def _one(link_name: str, imports: list[TopicPattern], peer_topic: str,
         message: codec.Message, peer: str) -> Accepted | ServiceError:
    [result] = accept_forwarded_batch(link_name, imports, [(peer_topic, message)], peer)
    return result


def _screen(imports: list[TopicPattern], peer_topic: str,
            message: codec.Message) -> Accepted | tuple[str, codec.Message]:
    """A forwarded message dropped before any query (malformed, a loop, Depth spent, not
    imported), or its origin and the message as it is to be stored here."""
    smuid_hdr = (message.get("Smuid") or "").strip()
    try:
        peer_context, _ = parse_smuid_header(smuid_hdr)
        depth = parse_int(message.get("Depth") or "0", minimum=-1)
        validate_topic(peer_topic)
    except ProtocolError as exc:
        # It would be as malformed when sent again: dropped (and ACKed), and said.
        return Accepted(smuid_hdr[:300], dropped=f"malformed ({exc.text})")
    origin = (message.get(ORIGIN) or smuid_hdr).strip()[:300]
    route = [r.strip() for r in (message.get(ROUTE) or peer_context).split(",") if r.strip()]
    me = own_context()
    if me.casefold() in {r.casefold() for r in route}:
        return Accepted(origin, dropped="loop")
    if depth == 0:
        return Accepted(origin, dropped="depth")
    if not imported(peer_topic, imports):
        return Accepted(origin, dropped="not imported")
    headers = [(k, v) for k, v in message.headers if k.casefold() not in _REPLACED]
    if message.get("Created") is None:
        headers.insert(0, ("Created", format_datetime(timezone.now())))
    headers += [("Depth", str(depth - 1 if depth > 0 else -1)), (ORIGIN, origin),
                (ROUTE, ",".join([*route, me]))]
    return origin, codec.Message(headers, message.sections)


def _store_screened(link_name: str, screened: list[tuple[int, str, str, codec.Message, str]],
                    results: list, peer: str) -> None:
    """Inside the caller's transaction: the screened messages not stored here before, as one
    publish batch, in order, with their origins."""
    seen = set(FederatedOrigin.objects.filter(
        origin__in=[item[1] for item in screened]).values_list("origin", flat=True))
    rows: list[tuple[int, str, Topic | Node, NewMessage]] = []
    for i, origin, peer_topic, stored, cmuid in screened:
        if origin in seen:
            results[i] = Accepted(origin, dropped="duplicate")
            continue
        try:
            topic = _ensure_topic(f"/{link_name}{peer_topic}")
            row = _row(topic, stored, link_name, cmuid)
        except (ProtocolError, ValueError) as exc:  # a header value that does not parse
            results[i] = Accepted(origin, dropped=f"malformed ({getattr(exc, 'text', exc)})")
            continue
        except ServiceError as exc:
            results[i] = exc
            continue
        seen.add(origin)
        rows.append((i, origin, topic, row))
    if not rows:
        return
    published = publish_prepared([(topic, row) for _, _, topic, row in rows],
                                 publisher="system", guid=link_name, peer=peer)
    origins = []
    committed: list[Published] = []
    for (i, origin, _, _), result in zip(rows, published, strict=True):
        if isinstance(result, ServiceError):
            results[i] = result
            continue
        results[i] = Accepted(origin, smuid=result.smuid)
        origins.append(FederatedOrigin(origin=origin, message_id=result.smuid, link=link_name))
        committed.append(result)
    FederatedOrigin.objects.bulk_create(origins)
    notify.messages_committed_on_commit(committed)


def _ensure_topic(path: str) -> Topic | Node:
    """The topic at ``path``, with every missing topic on the way made (the link's subtree
    mirrors the peer's topics as their messages arrive)."""
    known = topic_service.node(path)  # the in-memory tree: no query for a known topic
    if known is not None and known.state == Topic.State.ACTIVE and not known.is_virtual:
        return known
    paths.check_creatable(path)
    parent: Topic | None = None
    segs = paths.segments(path)
    for i in range(1, len(segs) + 1):
        sub = "/" + "/".join(segs[:i])
        found = topic_service.find(sub)
        if found is None:
            try:
                found = topic_service.create_for_server(sub, parent)
            except IntegrityError:  # made concurrently by another link
                found = topic_service.find(sub)
        if found is None or found.state != Topic.State.ACTIVE:
            raise not_found(f"topic {sub}")
        if found.is_virtual:
            found = found.resolved()
        parent = found
    assert parent is not None
    return parent


def _row(topic: Topic | Node, msg: codec.Message, link_name: str, cmuid: str) -> NewMessage:
    """The row of a forwarded message (as :func:`.prepare.prepare` makes a publish's, without
    the publisher's rights: the peer's are checked where it logged in)."""
    params = effective(topic)
    size = sum(len(s.body) for s in msg.sections)
    limit = params["max_message_size"]
    if limit is not None and size > limit:
        raise too_large(f"message of {size} bytes; {topic.path} takes at most {limit}")
    timeout_hdr = msg.get("Timeout")
    priority, sequence = msg.get("Priority"), msg.get("Sequence")
    created = msg.get("Created")
    return NewMessage(
        topic_id=topic.pk, publisher_id=None, publisher_guid=link_name, cmuid=cmuid[:200],
        name=(msg.get("Name") or "")[:128],
        priority=parse_int(priority, minimum=1) if priority else None,
        created=parse_datetime(created) if created else timezone.now(),
        timeout=parse_timeout(timeout_hdr) if timeout_hdr else params["expiry_timeout"],
        depth=parse_int(msg.get("Depth") or "0", minimum=-1),
        sequence=parse_int(sequence, minimum=1) if sequence else None,
        # A receipt goes to the publisher's account topic, which is on the first server.
        receipt=False,
        reply=parse_bool(msg.get("Reply") or "NO"),
        in_reply_to_id=None, headers=list(msg.headers), size=size, sections=msg.sections)


# ----------------------------------------------------------------------- the link's state


def prepare_link_topics(link_name: str, imports: list[TopicPattern]) -> None:
    """Make ``/<link-name>`` and the base of each import below it, so that subscribers
    here can subscribe (``/<link-name>/news/*``) before the first message arrives."""
    with transaction.atomic():
        _ensure_topic(f"/{link_name}")
        for imp in imports:
            if imp.base not in ("", "/"):
                _ensure_topic(f"/{link_name}{imp.base}")


def make_link_topic(snapshot: AccessSnapshot, path: str) -> None:
    """SUBSCRIBE below a link's root (``/east/news/x``) to a topic that is not here yet:
    it is made, with the missing topics above it, when the account may receive from the
    nearest one that is. A link's subtree mirrors the peer's on demand: what is subscribed
    to here is what the link subscribes to there (and a peer's account here, subscribing
    for its own subscribers, makes them the same way)."""
    if topic_service.node(path) is not None:
        return
    segs = paths.segments(path)
    if len(segs) < 2 or not Link.objects.filter(name__iexact=segs[0]).exists():
        return
    try:
        paths.check_creatable(path)
    except paths.InvalidTopicPath:
        return
    for i in range(len(segs) - 1, 0, -1):
        found = topic_service.node("/" + "/".join(segs[:i]))
        if found is not None:
            if (found.state == Topic.State.ACTIVE and not found.is_virtual
                    and snapshot.allows(found, receive_right(snapshot.account))):
                _ensure_topic(path)
            return


def record_state(link_id: int, state: str, error: str | None = None) -> None:
    """The supervisor's view of a link, for the admin: its state and last error."""
    now = timezone.now()
    fields: dict = {"state": state, "last_change": now}
    if error is not None:
        fields["last_error"] = error[:2000]
    if state == Link.State.UP:
        fields["last_connected"] = now
    Link.objects.filter(pk=link_id).update(**fields)


def record_counts(link_id: int, stored: int, dropped: int, subscribed: list[str]) -> None:
    Link.objects.filter(pk=link_id).update(stored=F("stored") + stored,
                                           dropped=F("dropped") + dropped,
                                           subscribed="\n".join(subscribed))


def backlog(link: Link) -> int | None:
    """What this server holds for the peer (its account here): messages not yet counted as
    forwarded, because the peer has not stored and ACKed them. None without a peer
    account."""
    if link.peer_account_id is None:
        return None
    return Delivery.objects.filter(
        account_id=link.peer_account_id, message__state="pending",
        state__in=[Delivery.State.PENDING, Delivery.State.NOTIFIED]).count()


# ------------------------------------------------------------- registering links (§9.5)
# "An administrator registers links (admin, REST, manage.py link)": the rules of a link's
# registration are here once, for ``manage.py link`` and the REST API alike.

#: What an administrator may set on a link (the rest is the supervisor's to write).
LINK_SETTINGS = ("host", "port", "account", "password", "imports", "tls", "tls_ca",
                 "tls_server_name", "peer_account", "enabled")


def find_link(name: str) -> Link:
    """The link named ``name`` (case-insensitive, as topic segments are); 404 otherwise."""
    link = (Link.objects.select_related("peer_account").filter(name__iexact=name).first()
            if name and "\x00" not in name else None)
    if link is None:
        raise not_found(f"link {name}")
    return link


def links() -> list[Link]:
    return list(Link.objects.select_related("peer_account").order_by("name"))


def save_link(name: str, *, create: bool, **changes) -> Link:
    """Register the link ``name`` (``create``: it must be new) or change it (it must exist):
    ``changes`` holds only the settings given (:data:`LINK_SETTINGS`); the others keep their
    value (a new link: the model's defaults). A password not given stays as it was: it is
    never shown back, so an edit cannot repeat it. ``peer_account`` is a username (or "" /
    None for none). ServiceError 400 for a setting the link cannot have, 404 / 409 for a
    link that is not there / already is. The running supervisor picks the change up within
    ``SMQP_LINK_RELOAD_SECONDS``."""
    from django.core.exceptions import ValidationError

    from accounts.models import Account

    unknown = set(changes) - set(LINK_SETTINGS)
    if unknown:
        raise bad_request(f"not a link setting: {', '.join(sorted(unknown))}")
    if create:
        try:
            Link(name=name).clean()  # a name no link can have is not looked up
        except ValidationError as exc:
            raise bad_request("; ".join(exc.messages)) from None
    elif not name or "\x00" in name:
        raise not_found(f"link {name}")
    with transaction.atomic():
        link = Link.objects.select_for_update().filter(name__iexact=name).first()
        if create and link is not None:
            raise conflict(f"link {link.name} exists")
        if not create and link is None:
            raise not_found(f"link {name}")
        link = link or Link(name=name)
        if "imports" in changes:
            given = changes.pop("imports")
            text = ",".join(given) if isinstance(given, list | tuple) else str(given or "")
            try:
                parsed = parse_imports(text or "/*")
            except ValueError as exc:
                raise bad_request(str(exc)) from None
            link.imports = ", ".join(str(p) for p in parsed)
        if "peer_account" in changes:
            peer_name = changes.pop("peer_account") or ""
            peer = None
            if peer_name:
                peer = Account.objects.filter(username_key=peer_name.casefold()).first()
                if peer is None:
                    raise bad_request(f"no account {peer_name!r} here")
            link.peer_account = peer
        if "port" in changes and not 1 <= int(changes["port"]) <= 65535:
            raise bad_request("port: 1 to 65535")
        for field in ("host", "account", "password", "tls_ca", "tls_server_name"):
            # They go out on the SMQP wire (LOGIN) or into a file name: one clean line.
            if any(ord(c) < 32 or ord(c) == 127 for c in str(changes.get(field) or "")):
                raise bad_request(f"{field}: no control characters")
        for field, value in changes.items():
            setattr(link, field, value)
        try:
            link.full_clean()
        except ValidationError as exc:
            raise bad_request("; ".join(exc.messages)) from None
        link.save()
    return link


def remove_link(name: str) -> None:
    """Remove a link. The supervisor then unsubscribes on the peer what the link held
    there, so the peer stops keeping messages for it."""
    deleted, _ = Link.objects.filter(pk=find_link(name).pk).delete()
    if not deleted:
        raise not_found(f"link {name}")


def link_data(link: Link) -> dict:
    """A link as the REST API, ``manage.py link list``, the overview and ``/metrics`` show
    it: its settings (never its password: ``password_set`` says whether one is stored),
    the supervisor's state, counters, last error, and this server's backlog for the
    peer."""
    return {
        "name": link.name, "host": link.host, "port": link.port, "tls": link.tls,
        "tls_ca": link.tls_ca, "tls_server_name": link.tls_server_name,
        "account": link.account, "password_set": bool(link.password),
        "imports": [p.strip() for p in link.imports.split(",") if p.strip()],
        "peer_account": link.peer_account.username if link.peer_account_id else None,
        "enabled": link.enabled, "state": link.state,
        "up": link.state == Link.State.UP,
        "last_error": link.last_error or None,
        "last_change": link.last_change.isoformat() if link.last_change else None,
        "last_connected": link.last_connected.isoformat() if link.last_connected else None,
        "stored": link.stored, "dropped": link.dropped,
        "subscribed": [p for p in link.subscribed.split("\n") if p],
        "backlog": backlog(link),
    }


__all__ = ["LINK_SETTINGS", "Accepted", "Published", "accept_forwarded", "backlog",
           "find_link", "imported", "interest", "link_data", "links", "make_link_topic",
           "own_context", "parse_imports", "prepare_link_topics", "record_counts",
           "record_state", "remove_link", "save_link"]
