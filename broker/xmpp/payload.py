"""Item payloads ↔ the broker's message (XMPP-PROFILE §3, "Payloads").

An item's single child element is stored as one data section of Content-Type
``application/xml`` and given back as it was. Any other message (published at another
door) is given as ``<message xmlns='urn:smqp:message:0'>``: a ``<header name=..>`` per header
attribute, a ``<section content-type=.. encoding='base64'>`` per data section, an
``application/xml`` section that parses as one element given as that element instead.
Stored XML is parsed again (defusedxml) before it goes into a stream: a body that is not one
well-formed element would break the subscriber's stream, so it goes base64 instead.
"""

from __future__ import annotations

import base64
from xml.etree.ElementTree import Element

from broker.domain.message import DataSection, Message

from .stanzas import SMQP_MESSAGE
from .xml import StreamFault, attrs, escape_text, parse_frame, serialize

XML_TYPE = "application/xml"


def message_of(payload: Element | None) -> Message:
    """The message an XMPP publish stores (no payload: no data section)."""
    if payload is None:
        return Message(headers=[], sections=[])
    body = serialize(payload).encode("utf-8")
    return Message(headers=[], sections=[DataSection([("Content-Type", XML_TYPE)], body)])


def _element_text(body: bytes, max_bytes: int) -> str | None:
    """The body as XML text ready to embed, or None when it is not one well-formed element
    (or carries what a stream may not: a DTD, a comment ...)."""
    try:
        return serialize(parse_frame(body, max_bytes))
    except StreamFault:
        return None


def is_xml(section: DataSection) -> bool:
    ctype = (section.content_type or "").split(";")[0].strip().lower()
    return ctype == XML_TYPE


def payload_xml(message: Message, max_bytes: int, xmpp_item: bool = False) -> str:
    """What goes inside ``<item>`` for a stored message; ``xmpp_item``: it was published
    as an item (at the XMPP door), so its one section is its payload."""
    if xmpp_item and not message.sections:
        return ""
    if xmpp_item and len(message.sections) == 1 and is_xml(message.sections[0]):
        text = _element_text(message.sections[0].body, max_bytes)
        if text is not None:
            return text
    out = [f"<message xmlns='{SMQP_MESSAGE}'>"]
    for name, value in message.headers:
        out.append(f"<header{attrs(name=name)}>{escape_text(value)}</header>")
    for section in message.sections:
        ctype = section.content_type
        text = _element_text(section.body, max_bytes) if is_xml(section) else None
        if text is not None:
            out.append(f"<section{attrs(content_type=ctype)}>{text}</section>")
        else:
            data = base64.b64encode(section.body).decode()
            out.append(f"<section{attrs(content_type=ctype)} encoding='base64'>{data}</section>")
    out.append("</message>")
    return "".join(out)
