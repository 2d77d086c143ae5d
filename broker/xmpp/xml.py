"""Parsing one RFC 7395 frame, and writing XML, with no I/O.

A frame is parsed with :mod:`defusedxml` (no DTD, no entity declaration, no external
reference) and its size is capped before any parsing. Processing instructions and comments,
anywhere in the frame (before the stanza too), are noted by the tree builder so that they
can be refused (RFC 6120 §11.1 restricts them); the XML declaration is no processing
instruction and may lead a frame.

The writer is hand-made because ElementTree's invents ``ns0:`` prefixes: a payload given
back to a client is written with default-namespace declarations, as clients write them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from xml.parsers import expat

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

XML_NS = "http://www.w3.org/XML/1998/namespace"


class StreamFault(Exception):
    """The stream must end with this RFC 6120 stream error condition."""

    def __init__(self, condition: str, text: str = "") -> None:
        super().__init__(condition)
        self.condition = condition
        self.text = text


def parse_frame(frame: str | bytes, max_bytes: int) -> ET.Element:
    """The one element a frame holds; raises :class:`StreamFault` (``policy-violation``,
    ``not-well-formed``, ``restricted-xml``)."""
    data = frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame
    if len(data) > max_bytes:
        raise StreamFault("policy-violation", f"frame larger than {max_bytes} bytes")
    builder = _Builder()
    parser = DefusedXMLParser(target=builder, forbid_dtd=True, forbid_entities=True,
                              forbid_external=True)
    try:
        parser.feed(data)
        root = parser.close()
    except DefusedXmlException as exc:
        raise StreamFault("restricted-xml", type(exc).__name__) from None
    except (ET.ParseError, expat.ExpatError, ValueError, UnicodeError):
        raise StreamFault("not-well-formed") from None
    if root is None or not isinstance(root.tag, str):
        raise StreamFault("not-well-formed")
    if builder.restricted:
        raise StreamFault("restricted-xml", "comment or processing instruction")
    return root


class _Builder:
    """A tree builder that notes every comment and processing instruction, also those
    outside the root element (before or after the stanza), which the tree does not keep."""

    def __init__(self) -> None:
        self._tree = ET.TreeBuilder()
        self.restricted = False

    def start(self, tag: str, attrib: dict[str, str]) -> ET.Element:
        return self._tree.start(tag, attrib)

    def end(self, tag: str) -> ET.Element:
        return self._tree.end(tag)

    def data(self, data: str) -> None:
        self._tree.data(data)

    def comment(self, text: str) -> None:
        self.restricted = True

    def pi(self, target: str, text: str | None = None) -> None:
        self.restricted = True

    def close(self) -> ET.Element:
        return self._tree.close()


def split_tag(tag: str) -> tuple[str, str]:
    """(namespace, local name) of an ElementTree tag."""
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return "", tag


def escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attr(text: str) -> str:
    return (escape_text(text).replace("'", "&apos;").replace('"', "&quot;")
            .replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;"))


def attrs(**values: str | None) -> str:
    """`` name='value'`` for each value given (None: left out); ``_`` in a name is ``-``."""
    return "".join(f" {k.rstrip('_').replace('_', '-')}='{escape_attr(v)}'"
                   for k, v in values.items() if v is not None)


def serialize(element: ET.Element, parent_ns: str | None = None) -> str:
    """``element`` as XML text, its namespace declared as the default one where it differs
    from ``parent_ns`` (the namespace in scope where the text goes; None: unknown, so it is
    always declared, ``xmlns=''`` for none, and the text fits inside any element)."""
    out: list[str] = []
    _write(element, parent_ns, out)
    return "".join(out)


def _write(element: ET.Element, parent_ns: str | None, out: list[str]) -> None:
    ns, local = split_tag(element.tag)
    out.append("<" + local)
    if ns != parent_ns:
        out.append(f" xmlns='{escape_attr(ns)}'")
    prefixes: dict[str, str] = {}
    for name, value in element.attrib.items():
        a_ns, a_local = split_tag(name)
        if not a_ns:
            out.append(f" {a_local}='{escape_attr(value)}'")
        elif a_ns == XML_NS:
            out.append(f" xml:{a_local}='{escape_attr(value)}'")
        else:
            prefix = prefixes.setdefault(a_ns, f"a{len(prefixes)}")
            out.append(f" xmlns:{prefix}='{escape_attr(a_ns)}' {prefix}:{a_local}="
                       f"'{escape_attr(value)}'")
    children = list(element)
    if not children and not element.text:
        out.append("/>")
        return
    out.append(">")
    if element.text:
        out.append(escape_text(element.text))
    for child in children:
        _write(child, ns, out)
        if child.tail:
            out.append(escape_text(child.tail))
    out.append(f"</{local}>")
