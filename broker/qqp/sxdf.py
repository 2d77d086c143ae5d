"""SXDF resources: the body of a QQP item, a sequence of elements ``<n>:<key>=<value>``.

A value is a string ``<n>:<bytes>`` followed by a newline, a map ``<n>%`` (a newline, then
``n`` elements) or an array ``<n>@`` (a newline, then ``n`` values). Spaces at the start of a
line indent nested values; the canonical form (QQP section 5, what a Signature covers) has
none. Here strings are ``bytes``, maps ``dict[str, Value]`` (keys in order, no repeats) and
arrays ``list[Value]``.
"""

from __future__ import annotations

from typing import Union

from .errors import QQPError
from .netstring import MAX_DIGITS, parse_length

Value = Union[bytes, dict[str, "Value"], list["Value"]]  # noqa: UP007 (a recursive alias)

#: Nesting accepted; deeper input is refused rather than exhausting the stack.
MAX_DEPTH = 64

_SPACE = 0x20
_NEWLINE = 0x0A
_INDENT = b"  "


class _Parser:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def skip_indent(self) -> None:
        """Spaces are skipped only at the start of a line (never inside a value)."""
        data, pos = self.data, self.pos
        if pos == 0 or data[pos - 1] == _NEWLINE:
            while pos < len(data) and data[pos] == _SPACE:
                pos += 1
            self.pos = pos

    def number(self) -> tuple[int, int]:
        """Digits and the byte that ends them (``:``, ``%`` or ``@``)."""
        data, start = self.data, self.pos
        end = start
        limit = min(len(data), start + MAX_DIGITS + 1)
        while end < limit and 0x30 <= data[end] <= 0x39:
            end += 1
        if end >= len(data) or end == start:
            raise QQPError("SXDF: a length expected")
        self.pos = end + 1
        return parse_length(data[start:end]), data[end]

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise QQPError("SXDF: a string runs past the end")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def newline(self) -> None:
        if self.pos >= len(self.data) or self.data[self.pos] != _NEWLINE:
            raise QQPError("SXDF: a newline expected")
        self.pos += 1

    def element(self, depth: int) -> tuple[str, Value]:
        self.skip_indent()
        n, end = self.number()
        if end != 0x3A:  # ":"
            raise QQPError("SXDF: a key expected")
        raw = self.take(n)
        if self.take(1) != b"=":
            raise QQPError("SXDF: '=' expected after a key")
        try:
            key = raw.decode()
        except UnicodeDecodeError:
            raise QQPError("SXDF: a key is not UTF-8") from None
        return key, self.value(depth)

    def value(self, depth: int) -> Value:
        if depth > MAX_DEPTH:
            raise QQPError("SXDF: nested too deep")
        n, end = self.number()
        if end == 0x3A:  # ":" a string
            text = self.take(n)
            self.newline()
            return text
        if end == 0x25:  # "%" a map
            self.newline()
            self._room(n)
            entries: dict[str, Value] = {}
            for _ in range(n):
                key, value = self.element(depth + 1)
                if key in entries:
                    raise QQPError(f"SXDF: key {key!r} repeated")
                entries[key] = value
            return entries
        if end == 0x40:  # "@" an array
            self.newline()
            self._room(n)
            items: list[Value] = []
            for _ in range(n):
                self.skip_indent()
                items.append(self.value(depth + 1))
            return items
        raise QQPError("SXDF: ':', '%' or '@' expected after a length")

    def _room(self, n: int) -> None:
        # Each entry takes at least three bytes ("0:\n"): a count beyond that is a lie.
        if n * 3 > len(self.data) - self.pos:
            raise QQPError("SXDF: more entries announced than there is data")


def parse_resource(body: bytes) -> dict[str, Value]:
    """The elements of one resource (an item's netstring body); raises QQPError."""
    parser = _Parser(body)
    elements: dict[str, Value] = {}
    while True:
        parser.skip_indent()
        if parser.pos >= len(body):
            return elements
        key, value = parser.element(0)
        if key in elements:
            raise QQPError(f"SXDF: element {key!r} repeated")
        elements[key] = value


def parse_value(data: bytes) -> Value:
    """One value that must fill ``data`` exactly (a canonical ``Data`` element, say)."""
    parser = _Parser(data)
    value = parser.value(0)
    if parser.pos != len(data):
        raise QQPError("SXDF: data after the value")
    return value


def _encode_value(value: Value, level: int, indent: bytes, out: list[bytes]) -> None:
    if isinstance(value, bytes):
        out.append(b"%d:%b\n" % (len(value), value))
    elif isinstance(value, dict):
        out.append(b"%d%%\n" % len(value))
        for key, item in value.items():
            _encode_element(key, item, level + 1, indent, out)
    elif isinstance(value, list):
        out.append(b"%d@\n" % len(value))
        for item in value:
            out.append(indent * (level + 1))
            _encode_value(item, level + 1, indent, out)
    else:
        raise TypeError(f"not an SXDF value: {type(value).__name__}")


def _encode_element(key: str, value: Value, level: int, indent: bytes,
                    out: list[bytes]) -> None:
    raw = key.encode()
    out.append(b"%b%d:%b=" % (indent * level, len(raw), raw))
    _encode_value(value, level, indent, out)


def encode_resource(elements: dict[str, Value], *, pretty: bool = True) -> bytes:
    """A resource body; ``pretty`` indents nested values as the draft's examples do."""
    out: list[bytes] = []
    indent = _INDENT if pretty else b""
    for key, value in elements.items():
        _encode_element(key, value, 0, indent, out)
    return b"".join(out)


def canonical(value: Value) -> bytes:
    """The canonical form of a value (QQP section 5): what follows ``4:Data=`` with every
    indentation removed, the final newline included. A Signature signs these bytes."""
    out: list[bytes] = []
    _encode_value(value, 0, b"", out)
    return b"".join(out)
