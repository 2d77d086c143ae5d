"""The stanzas of the profile's XEP-0060 / XEP-0254 subset: IQs parsed into command objects,
and the server's stanzas written.

Hand-written rather than slixmpp's stanza classes: those are bound to slixmpp's
``ElementBase`` / ``XMLStream`` machinery (plugin registration, an asyncio stream, its own
JID handling), which would pull an I/O library into a codec that must stay sans-IO, and the
profile uses a dozen fixed shapes only. Each shape is written once here.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol
from xml.etree.ElementTree import Element

from .xml import attrs, escape_text, serialize, split_tag

CLIENT = "jabber:client"
FRAMING = "urn:ietf:params:xml:ns:xmpp-framing"
SASL = "urn:ietf:params:xml:ns:xmpp-sasl"
BIND = "urn:ietf:params:xml:ns:xmpp-bind"
SESSION = "urn:ietf:params:xml:ns:xmpp-session"
STANZAS = "urn:ietf:params:xml:ns:xmpp-stanzas"
STREAMS = "urn:ietf:params:xml:ns:xmpp-streams"
PUBSUB = "http://jabber.org/protocol/pubsub"
PUBSUB_OWNER = PUBSUB + "#owner"
PUBSUB_EVENT = PUBSUB + "#event"
PUBSUB_ERRORS = PUBSUB + "#errors"
DISCO_INFO = "http://jabber.org/protocol/disco#info"
DISCO_ITEMS = "http://jabber.org/protocol/disco#items"
DATA_FORMS = "jabber:x:data"
QUEUEING = "urn:xmpp:pubsub:queueing:0"
PING = "urn:xmpp:ping"
SMQP_MESSAGE = "urn:smqp:message:0"

SERVICE_FEATURES = (
    DISCO_INFO, DISCO_ITEMS, PUBSUB, PUBSUB + "#publish", PUBSUB + "#subscribe",
    PUBSUB + "#retract-items", PUBSUB + "#retrieve-items", PUBSUB + "#create-nodes",
    PUBSUB + "#delete-nodes", PUBSUB + "#config-node", QUEUEING,
)
SERVER_FEATURES = (DISCO_INFO, DISCO_ITEMS, PING)

# RFC 6120 §8.3.2: the error type that goes with each condition used here.
ERROR_TYPES = {
    "bad-request": "modify", "conflict": "cancel", "feature-not-implemented": "cancel",
    "forbidden": "auth", "internal-server-error": "wait", "item-not-found": "cancel",
    "not-acceptable": "modify", "not-allowed": "cancel", "not-authorized": "auth",
    "policy-violation": "modify", "resource-constraint": "wait",
    "service-unavailable": "cancel", "unexpected-request": "wait",
}


class IqFault(Exception):
    """An IQ answered with an error: the stanza condition, and optionally the pubsub one
    (``http://jabber.org/protocol/pubsub#errors``, with its ``feature`` for
    ``unsupported``)."""

    def __init__(self, condition: str, pubsub: str | None = None, feature: str | None = None,
                 text: str = "", extra: str = "") -> None:
        super().__init__(condition)
        self.condition, self.pubsub, self.feature, self.text = condition, pubsub, feature, text
        self.extra = extra  # child elements echoed before <error/> (XEP-0254's options form)


class Refused(Protocol):
    """A services' refusal as the XMPP door reads it (a ``ServiceError``): its SMQP code and
    text, and its Refusal's XMPP conditions (``xmpp``, ``pubsub``, ``xmpp_text``)."""

    @property
    def code(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def refusal(self) -> Any: ...


def fault_of(exc: Refused) -> IqFault:
    """The IQ error for a refusal: the conditions and text its Refusal gives XMPP (the XMPP
    door's one mapping of errors to the wire)."""
    refusal = exc.refusal
    return IqFault(refusal.xmpp, refusal.pubsub,
                   text=refusal.xmpp_text.format(code=exc.code, text=exc.text))


def unsupported(feature: str) -> IqFault:
    return IqFault("feature-not-implemented", "unsupported", feature)


# ---------------------------------------------------------------------------- commands


@dataclass(slots=True)
class Bind:
    resource: str | None


@dataclass(slots=True)
class Session:
    pass


@dataclass(slots=True)
class Ping:
    pass


@dataclass(slots=True)
class DiscoInfo:
    node: str | None


@dataclass(slots=True)
class DiscoItems:
    node: str | None


@dataclass(slots=True)
class Create:
    node: str
    config: dict[str, list[str]] = field(default_factory=dict)


@dataclass(slots=True)
class Delete:
    node: str


@dataclass(slots=True)
class ConfigureGet:
    node: str


@dataclass(slots=True)
class ConfigureSet:
    node: str
    config: dict[str, list[str]]


@dataclass(slots=True)
class Subscribe:
    node: str
    jid: str
    options: dict[str, list[str]] | None


@dataclass(slots=True)
class Unsubscribe:
    node: str
    jid: str


@dataclass(slots=True)
class Publish:
    node: str
    item_id: str | None
    payload: Element | None


@dataclass(slots=True)
class Retract:
    node: str
    ids: list[str]


@dataclass(slots=True)
class Unlock:
    node: str
    ids: list[str]


@dataclass(slots=True)
class Items:
    node: str
    max_items: int | None
    ids: list[str]


@dataclass(slots=True)
class Iq:
    """An IQ from the client: its envelope and what it asks (None: a result or error of
    the client's own, answered by nothing)."""

    id: str
    type: str
    to: str | None
    command: Any


# ---------------------------------------------------------------------------- parsing


def _children(element: Element) -> list[Element]:
    return [c for c in element if isinstance(c.tag, str)]


def data_form(element: Element | None) -> dict[str, list[str]]:
    """The fields of a submitted ``jabber:x:data`` form inside ``element`` (var → values)."""
    if element is None:
        return {}
    form = element.find(f"{{{DATA_FORMS}}}x")
    if form is None:
        return {}
    if form.get("type", "submit") not in ("submit", "form", "result"):
        raise IqFault("bad-request", text="data form type")
    out: dict[str, list[str]] = {}
    for f in form.findall(f"{{{DATA_FORMS}}}field"):
        var = f.get("var")
        if var:
            out[var] = [v.text or "" for v in f.findall(f"{{{DATA_FORMS}}}value")]
    return out


def _node(element: Element, required: bool = True) -> str:
    node = element.get("node")
    if not node:
        if required:
            raise IqFault("bad-request", "nodeid-required")
        return ""
    return node


def _item_ids(element: Element) -> list[str]:
    ids = []
    for item in element.findall(f"{{{PUBSUB}}}item"):
        item_id = item.get("id")
        if not item_id:
            raise IqFault("bad-request", "item-required")
        ids.append(item_id)
    return ids


def parse_iq(element: Element) -> Iq:
    """An IQ stanza as a command; raises :class:`IqFault` for one that is answered with an
    error (the caller needs its id: :func:`iq_envelope`)."""
    iq_id, iq_type, to = iq_envelope(element)
    if iq_type in ("result", "error"):
        return Iq(iq_id, iq_type, to, None)
    if iq_type not in ("get", "set"):
        raise IqFault("bad-request", text="IQ type")
    payload = _children(element)
    if len(payload) != 1:
        raise IqFault("bad-request", text="an IQ get or set holds one element")
    child = payload[0]
    ns, name = split_tag(child.tag)
    return Iq(iq_id, iq_type, to, _command(ns, name, child, iq_type))


def iq_envelope(element: Element) -> tuple[str, str, str | None]:
    return element.get("id") or "", element.get("type") or "", element.get("to")


def _command(ns: str, name: str, child: Element, iq_type: str) -> Any:
    if (ns, name) == (BIND, "bind") and iq_type == "set":
        resource = child.find(f"{{{BIND}}}resource")
        return Bind((resource.text or "").strip() or None if resource is not None else None)
    if (ns, name) == (SESSION, "session"):
        return Session()
    if (ns, name) == (PING, "ping"):
        return Ping()
    if ns == DISCO_INFO and name == "query" and iq_type == "get":
        return DiscoInfo(child.get("node") or None)
    if ns == DISCO_ITEMS and name == "query" and iq_type == "get":
        return DiscoItems(child.get("node") or None)
    if (ns, name) == (QUEUEING, "unlock"):
        return Unlock(_node(child), _item_ids_ns(child, QUEUEING))
    if (ns, name) == (PUBSUB, "pubsub"):
        return _pubsub(child, iq_type)
    if (ns, name) == (PUBSUB_OWNER, "pubsub"):
        return _owner(child, iq_type)
    raise IqFault("service-unavailable", text=f"{{{ns}}}{name} is not served here")


def _item_ids_ns(element: Element, ns: str) -> list[str]:
    ids = [i.get("id") or "" for i in element.findall(f"{{{ns}}}item")]
    if not ids or not all(ids):
        raise IqFault("bad-request", "item-required")
    return ids


def _pubsub(element: Element, iq_type: str) -> Any:
    verbs = _children(element)
    if not verbs:
        raise IqFault("bad-request")
    verb = verbs[0]
    ns, name = split_tag(verb.tag)
    if (ns, name) == (QUEUEING, "unlock"):
        # XEP-0254 §2.4 writes unlock inside <pubsub/> (XMPP-PROFILE: queue nodes).
        return Unlock(_node(verb), _item_ids_ns(verb, QUEUEING))
    if ns != PUBSUB:
        raise IqFault("bad-request")
    if name == "create" and iq_type == "set":
        configure = element.find(f"{{{PUBSUB}}}configure")
        return Create(_node(verb), data_form(configure))
    if name == "subscribe" and iq_type == "set":
        options = element.find(f"{{{PUBSUB}}}options")
        return Subscribe(_node(verb), verb.get("jid") or "",
                         data_form(options) if options is not None else None)
    if name == "unsubscribe" and iq_type == "set":
        return Unsubscribe(_node(verb), verb.get("jid") or "")
    if name == "publish" and iq_type == "set":
        items = verb.findall(f"{{{PUBSUB}}}item")
        if len(items) != 1:
            raise IqFault("bad-request", "invalid-payload" if items else "item-required")
        body = _children(items[0])
        if len(body) > 1:
            raise IqFault("bad-request", "invalid-payload")
        return Publish(_node(verb), items[0].get("id") or None, body[0] if body else None)
    if name == "retract":  # XEP-0254's examples send it as a get
        ids = _item_ids(verb)
        if not ids:
            raise IqFault("bad-request", "item-required")
        return Retract(_node(verb), ids)
    if name == "items" and iq_type == "get":
        max_items = verb.get("max_items")
        limit = None
        if max_items is not None:
            try:
                limit = int(max_items)
            except ValueError:
                raise IqFault("bad-request", text="max_items") from None
            if limit < 0:
                raise IqFault("bad-request", text="max_items")
        return Items(_node(verb), limit, _item_ids(verb))
    if name == "configure" and iq_type == "get":
        return ConfigureGet(_node(verb))
    raise unsupported({"options": "subscription-options", "subscriptions":
                       "retrieve-subscriptions", "affiliations": "retrieve-affiliations",
                       "default": "retrieve-default"}.get(name, name))


def _owner(element: Element, iq_type: str) -> Any:
    verbs = _children(element)
    if not verbs:
        raise IqFault("bad-request")
    verb = verbs[0]
    ns, name = split_tag(verb.tag)
    if ns != PUBSUB_OWNER:
        raise IqFault("bad-request")
    if name == "delete" and iq_type == "set":
        return Delete(_node(verb))
    if name == "configure" and iq_type == "get":
        return ConfigureGet(_node(verb))
    if name == "configure" and iq_type == "set":
        return ConfigureSet(_node(verb), data_form(verb))
    raise unsupported({"purge": "purge-nodes", "subscriptions": "manage-subscriptions",
                       "affiliations": "modify-affiliations",
                       "default": "retrieve-default"}.get(name, name))


# ---------------------------------------------------------------------------- writing


def open_frame(domain: str, stream_id: str) -> str:
    return (f"<open xmlns='{FRAMING}'{attrs(id=stream_id, **{'from': domain})} "
            "version='1.0' xml:lang='en'/>")


def close_frame() -> str:
    return f"<close xmlns='{FRAMING}'/>"


def features_before_auth(mechanisms: list[str]) -> str:
    mechs = "".join(f"<mechanism>{escape_text(m)}</mechanism>" for m in mechanisms)
    return (f"<stream:features xmlns:stream='http://etherx.jabber.org/streams'>"
            f"<mechanisms xmlns='{SASL}'>{mechs}</mechanisms></stream:features>")


def features_after_auth() -> str:
    return (f"<stream:features xmlns:stream='http://etherx.jabber.org/streams'>"
            f"<bind xmlns='{BIND}'/><session xmlns='{SESSION}'><optional/></session>"
            "</stream:features>")


def _b64(data: bytes | None) -> str:
    if data is None:
        return ""
    return base64.b64encode(data).decode() or "="


def sasl_challenge(data: bytes) -> str:
    return f"<challenge xmlns='{SASL}'>{_b64(data)}</challenge>"


def sasl_success(data: bytes | None) -> str:
    if not data:
        return f"<success xmlns='{SASL}'/>"
    return f"<success xmlns='{SASL}'>{_b64(data)}</success>"


def sasl_failure(condition: str, text: str = "") -> str:
    extra = f"<text xml:lang='en'>{escape_text(text)}</text>" if text else ""
    return f"<failure xmlns='{SASL}'><{condition}/>{extra}</failure>"


def stream_error(condition: str, text: str = "") -> str:
    extra = (f"<text xmlns='{STREAMS}' xml:lang='en'>{escape_text(text)}</text>"
             if text else "")
    return (f"<stream:error xmlns:stream='http://etherx.jabber.org/streams'>"
            f"<{condition} xmlns='{STREAMS}'/>{extra}</stream:error>")


def iq_result(iq_id: str, sender: str | None, to: str, inner: str = "") -> str:
    """``sender``: the ``to`` of the request (None: it had none, and the reply has no
    ``from``, as clients match replies to requests sent to their own server)."""
    head = f"<iq xmlns='{CLIENT}' type='result'{attrs(id=iq_id, to=to, **{'from': sender})}"
    return head + (f">{inner}</iq>" if inner else "/>")


def iq_error(iq_id: str, sender: str | None, to: str, fault: IqFault) -> str:
    cond = fault.condition
    detail = ""
    if fault.pubsub:
        detail = f"<{fault.pubsub} xmlns='{PUBSUB_ERRORS}'{attrs(feature=fault.feature)}/>"
    text = (f"<text xmlns='{STANZAS}' xml:lang='en'>{escape_text(fault.text)}</text>"
            if fault.text else "")
    return (f"<iq xmlns='{CLIENT}' type='error'{attrs(id=iq_id, to=to, **{'from': sender})}>"
            f"{fault.extra}<error type='{ERROR_TYPES.get(cond, 'cancel')}'>"
            f"<{cond} xmlns='{STANZAS}'/>{detail}{text}</error></iq>")


def bind_result(jid: str) -> str:
    return f"<bind xmlns='{BIND}'><jid>{escape_text(jid)}</jid></bind>"


def disco_info(identity: tuple[str, str, str], features: tuple[str, ...] | list[str],
               node: str | None = None, form: str = "") -> str:
    category, kind, name = identity
    feats = "".join(f"<feature var='{f}'/>" for f in features)
    return (f"<query xmlns='{DISCO_INFO}'{attrs(node=node)}>"
            f"<identity{attrs(category=category, type=kind, name=name)}/>{feats}{form}</query>")


def disco_items(jid: str, nodes: list[tuple[str, str]], node: str | None = None) -> str:
    items = "".join(f"<item{attrs(jid=jid, node=n, name=name)}/>" for n, name in nodes)
    return f"<query xmlns='{DISCO_ITEMS}'{attrs(node=node)}>{items}</query>"


def form(form_type: str, fields: list[tuple[str, str, list[str]]], kind: str = "form") -> str:
    """A ``jabber:x:data`` form: FORM_TYPE and (var, field type, values) fields."""
    out = [f"<x xmlns='{DATA_FORMS}' type='{kind}'><field var='FORM_TYPE' type='hidden'>"
           f"<value>{escape_text(form_type)}</value></field>"]
    for var, ftype, values in fields:
        vals = "".join(f"<value>{escape_text(v)}</value>" for v in values)
        out.append(f"<field{attrs(var=var, type=ftype)}>{vals}</field>")
    out.append("</x>")
    return "".join(out)


def queue_options_required(node: str, jid: str) -> str:
    """XEP-0254 §2.1: the subscribe request echoed with the options form to fill in."""
    return (f"<pubsub xmlns='{PUBSUB}'><subscribe{attrs(node=node, jid=jid)}/>"
            f"<options{attrs(node=node, jid=jid)}><x xmlns='{DATA_FORMS}' type='form'>"
            "<field var='FORM_TYPE' type='hidden'>"
            f"<value>{PUBSUB}#subscribe_options</value></field>"
            "<field type='text-single' var='pubsub#queue_requests'><required/></field>"
            "</x></options></pubsub>")


def subscription_id(account_id: int, node: str, selector: tuple[str, str] | None) -> str:
    """The subid of an account's subscription to ``node``: one per (node, selector)
    (profile §9.2), so the selector (class, expression) is part of it."""
    kind, expression = selector or ("", "")
    return hashlib.sha1(f"{account_id}:{node.casefold()}:{kind.upper()}:"
                        f"{expression}".encode()).hexdigest()


def subscription_result(node: str, jid: str, subid: str,
                        options: list[tuple[str, str, list[str]]] | None) -> str:
    opts = ""
    if options:
        opts = (f"<options{attrs(node=node, jid=jid)}>"
                f"{form(PUBSUB + '#subscribe_options', options, 'result')}</options>")
    return (f"<pubsub xmlns='{PUBSUB}'><subscription{attrs(node=node, jid=jid, subid=subid)}"
            f" subscription='subscribed'/>{opts}</pubsub>")


def publish_result(node: str, item_id: str) -> str:
    return (f"<pubsub xmlns='{PUBSUB}'><publish{attrs(node=node)}>"
            f"<item{attrs(id=item_id)}/></publish></pubsub>")


def items_result(node: str, items: list[tuple[str, str]]) -> str:
    body = "".join(f"<item{attrs(id=i)}>{p}</item>" for i, p in items)
    return f"<pubsub xmlns='{PUBSUB}'><items{attrs(node=node)}>{body}</items></pubsub>"


def configure_result(node: str, fields: list[tuple[str, str, list[str]]]) -> str:
    return (f"<pubsub xmlns='{PUBSUB_OWNER}'><configure{attrs(node=node)}>"
            f"{form(PUBSUB + '#node_config', fields)}</configure></pubsub>")


def _event(sender: str, to: str, inner: str) -> str:
    return (f"<message xmlns='{CLIENT}'{attrs(to=to, **{'from': sender})}>"
            f"<event xmlns='{PUBSUB_EVENT}'>{inner}</event></message>")


def item_event(sender: str, to: str, node: str, item_id: str, payload: str) -> str:
    """A publish notification with its payload (``payload``: XML text, namespaces
    declared)."""
    return _event(sender, to, f"<items{attrs(node=node)}><item{attrs(id=item_id)}>"
                              f"{payload}</item></items>")


def retract_event(sender: str, to: str, node: str, item_ids: list[str]) -> str:
    inner = "".join(f"<retract{attrs(id=i)}/>" for i in item_ids)
    return _event(sender, to, f"<items{attrs(node=node)}>{inner}</items>")


def unlock_event(sender: str, to: str, node: str, item_ids: list[str]) -> str:
    inner = "".join(f"<unlock xmlns='{QUEUEING}'{attrs(id=i)}/>" for i in item_ids)
    return _event(sender, to, f"<items{attrs(node=node)}>{inner}</items>")


def payload_text(element: Element) -> str:
    """A client's item payload as it is stored (and given back)."""
    return serialize(element)


#: Why a subscription ended (profile §9.3), beside XEP-0060's notification, which has no
#: place for a reason.
SUBSCRIPTION_REASON = "urn:smqp:subscription:0"


def subscription_event(sender: str, to: str, node: str, jid: str, reason: str) -> str:
    """XEP-0060 §7.1.3's subscription state notification ``subscription='none'``: the
    subscription on ``node`` ended (``reason``: lease, revoked or removed)."""
    why = (f"<reason xmlns='{SUBSCRIPTION_REASON}'>{escape_text(reason)}</reason>"
           if reason else "")
    return (f"<message xmlns='{CLIENT}'{attrs(to=to, **{'from': sender})}>"
            f"<event xmlns='{PUBSUB_EVENT}'><subscription{attrs(node=node, jid=jid)}"
            f" subscription='none'/></event>{why}</message>")
