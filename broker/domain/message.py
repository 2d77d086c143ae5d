"""The broker's message, whatever door it came through: a header of attributes (``Name``,
``Priority``, ``Timeout`` ...) in the order given, and zero or more data sections.

Every door translates its own wire form to and from this type (the SMQP codec in
:mod:`broker.smqp.message`); the services, the delivery layer and the store see only
this.
Header names have a canonical spelling (``pri`` is ``Priority``); ``X-`` names and unknown
names are kept as given. A section's ``Content-Length`` is never kept among its headers: it is
always ``len(body)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

__all__ = ["CANONICAL_NAMES", "DataSection", "Message", "canonical_name"]

CANONICAL_NAMES: dict[str, str] = {
    "name": "Name",
    "priority": "Priority",
    "pri": "Priority",
    "created": "Created",
    "receipt": "Receipt",
    "reply": "Reply",
    "timeout": "Timeout",
    "depth": "Depth",
    "sequence": "Sequence",
    "seq": "Sequence",
    "mime-version": "MIME-Version",
    "smuid": "Smuid",
    "cmuid": "Cmuid",
    "topic": "Topic",
    "content-type": "Content-Type",
    "content-length": "Content-Length",
    "content-encoding": "Content-Encoding",
    "encryption": "Encryption",
}


def canonical_name(name: str) -> str:
    """Return the canonical spelling of a header name (``pri`` -> ``Priority``).

    ``X-`` names and unknown names are returned as given.
    """
    return CANONICAL_NAMES.get(name.lower(), name)


@functools.lru_cache(maxsize=4096)  # bounded: X- names are the client's to choose
def _folded(name: str) -> str:
    """A header name's canonical spelling, lower-cased (``Pri`` and ``priority`` →
    ``priority``): what :func:`_lookup` compares."""
    low = name.lower()
    return CANONICAL_NAMES.get(low, low).lower()


def _lookup(headers: list[tuple[str, str]], name: str) -> str | None:
    want = _folded(name)
    for k, v in headers:
        if _folded(k) == want:
            return v
    return None


@dataclass(slots=True)
class DataSection:
    """One data section: its data header (without ``Content-Length``) and its bytes."""

    headers: list[tuple[str, str]]
    body: bytes

    @property
    def content_type(self) -> str | None:
        """The ``Content-Type`` value, or None when absent."""
        return _lookup(self.headers, "Content-Type")

    @property
    def content_length(self) -> int:
        """The length of the body (what ``Content-Length`` says on the wire)."""
        return len(self.body)

    def get(self, name: str) -> str | None:
        """Case-insensitive lookup of a data header attribute."""
        if name.lower() == "content-length":
            return str(len(self.body))
        return _lookup(self.headers, name)


@dataclass(slots=True)
class Message:
    """A message: header attributes in wire order and its data sections."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    sections: list[DataSection] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        """Case-insensitive header lookup; ``Pri``/``Seq`` find Priority/Sequence."""
        return _lookup(self.headers, name)
