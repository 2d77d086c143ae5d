"""SMQP messages (profile section 6): a header of attributes and zero or more data sections.

Header names are normalised to their canonical spelling on parse (``pri`` becomes
``Priority``); ``X-`` names and unknown names are kept as sent. ``Content-Length`` is not kept
among a section's headers: it is always ``len(body)`` and is written from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from broker.domain.message import CANONICAL_NAMES, DataSection, Message, canonical_name

from .errors import bad_request
from .values import (
    MAX_INT32,
    parse_bool,
    parse_datetime,
    parse_int,
    parse_reply_smuid,
    parse_timeout,
)

__all__ = [
    "CANONICAL_NAMES",
    "DataSection",
    "Message",
    "canonical_name",
    "check_data_header",
    "check_data_header_end",
    "check_publish_header",
    "parse_header_line",
    "serialize_message",
    "validate_publish_headers",
]

def parse_header_line(line: str) -> tuple[str, str]:
    """Split ``Name: value`` into the canonical name and the value stripped of blanks."""
    i = line.find(":")
    if i <= 0:
        raise bad_request("malformed header")
    name = line[:i]
    if not (name.isascii() and name.isprintable()) or " " in name:
        raise bad_request("malformed header")
    return CANONICAL_NAMES.get(name.lower(), name), line[i + 1 :].strip(" \t")


# ------------------------------------------------------------------------------ validation

_MIME_VERSION_RE = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}")


def _check_cmuid_header(value: str) -> None:
    parts = value.split("/", 2)
    if len(parts) != 3 or not all(parts) or " " in value:
        raise bad_request("invalid Cmuid")


def _check_name(value: str) -> None:
    if len(value) > 128:
        raise bad_request("Name longer than 128 characters")


def _check_priority(value: str) -> None:
    parse_int(value, minimum=1, maximum=MAX_INT32, what="Priority")


def _check_created(value: str) -> None:
    parse_datetime(value)


def _check_bool(value: str) -> None:
    parse_bool(value)


def _check_timeout(value: str) -> None:
    parse_timeout(value)


def _check_depth(value: str) -> None:
    parse_int(value, minimum=-1, maximum=MAX_INT32, what="Depth")


def _check_sequence(value: str) -> None:
    parse_int(value, minimum=1, what="Sequence")


def _check_mime_version(value: str) -> None:
    if _MIME_VERSION_RE.fullmatch(value) is None:
        raise bad_request("invalid MIME-Version")


def _check_smuid(value: str) -> None:
    parse_reply_smuid(value)


_PUB_CHECKS = {
    "Name": _check_name,
    "Priority": _check_priority,
    "Created": _check_created,
    "Receipt": _check_bool,
    "Reply": _check_bool,
    "Timeout": _check_timeout,
    "Depth": _check_depth,
    "Sequence": _check_sequence,
    "MIME-Version": _check_mime_version,
}
_REPLY_CHECKS = {**_PUB_CHECKS, "Smuid": _check_smuid, "Cmuid": _check_cmuid_header}
_DATA_NAMES = frozenset({"Content-Type", "Content-Encoding", "Encryption"})


def check_publish_header(name: str, value: str, seen: set[str], *, reply: bool = False) -> None:
    """Check one header attribute of a published message (``name`` canonical).

    ``seen`` collects the known attributes met so far in the message, to refuse repeats.
    Raises ``ProtocolError(400, ...)`` naming the problem.
    """
    check = (_REPLY_CHECKS if reply else _PUB_CHECKS).get(name)
    if check is None:
        if name[:2].lower() == "x-":
            return
        raise bad_request(f"unknown attribute {name}")
    if name in seen:
        raise bad_request(f"duplicate attribute {name}")
    seen.add(name)
    check(value)


def check_data_header(name: str, seen: set[str]) -> None:
    """Check one data header attribute (other than Content-Length) of a section."""
    if name in _DATA_NAMES:
        if name in seen:
            raise bad_request(f"duplicate attribute {name}")
        seen.add(name)
    elif name[:2].lower() != "x-":
        raise bad_request(f"unknown data attribute {name}")


def check_data_header_end(seen: set[str]) -> None:
    """Check that a section's data header held a Content-Type."""
    if "Content-Type" not in seen:
        raise bad_request("missing Content-Type")


def validate_publish_headers(msg: Message, *, reply: bool = False) -> None:
    """Check a published message's attributes; raise ``ProtocolError(400, ...)`` if bad.

    Allowed header attributes: Name (at most 128 characters), Priority (> 0), Created
    (date-time), Receipt and Reply (booleans), Timeout, Depth (>= -1), Sequence (> 0),
    MIME-Version and ``X-*``; with ``reply`` (PUB REPLY) also Smuid and Cmuid. Each data
    section needs a Content-Type and may carry Content-Encoding, Encryption and ``X-*``.
    A known attribute may appear once. (``ServerConnection`` runs the same checks line by
    line as the message arrives.)
    """
    seen: set[str] = set()
    for name, value in msg.headers:
        check_publish_header(name, value, seen, reply=reply)
    for section in msg.sections:
        seen.clear()
        for name, _value in section.headers:
            if name != "Content-Length":
                check_data_header(name, seen)
        check_data_header_end(seen)


# --------------------------------------------------------------------------- serialisation


def _header_text(headers: Iterable[tuple[str, str]], parts: list[str]) -> int:
    n = 0
    for k, v in headers:
        parts.append(f"{k}: {v}\r\n")
        n += 1
    return n


def _check_lines(text: str, lines: int) -> None:
    # Every header line ends in exactly one CRLF: more CR or LF means a field smuggled
    # a line break, which would let it inject lines into the stream.
    if text.count("\n") != lines or text.count("\r") != lines:
        raise ValueError("header name or value holds a line break")


def serialize_message(msg: Message, *, prefix_headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """Serialise a message: header lines (``prefix_headers`` first), an empty line, then for
    each section its data header (Content-Type, Content-Length, the others), an empty line,
    the body and CRLF; then ``.`` CRLF.

    Raises ``ValueError`` when a header name or value holds CR or LF.
    """
    parts: list[str] = []
    n = _header_text(prefix_headers, parts)
    n += _header_text(msg.headers, parts)
    parts.append("\r\n")
    head = "".join(parts)
    _check_lines(head, n + 1)
    if not msg.sections:
        return head.encode() + b".\r\n"
    chunks = [head.encode()]
    for section in msg.sections:
        body = section.body
        parts = []
        ctype = None
        for k, v in section.headers:
            if ctype is None and k == "Content-Type":
                ctype = v
            elif k.lower() != "content-length":
                parts.append(f"{k}: {v}\r\n")
        lines = len(parts) + 2
        if ctype is not None:
            parts.insert(0, f"Content-Type: {ctype}\r\n")
            lines += 1
        parts.insert(1 if ctype is not None else 0, f"Content-Length: {len(body)}\r\n")
        parts.append("\r\n")
        text = "".join(parts)
        _check_lines(text, lines)
        chunks.append(text.encode())
        chunks.append(body)
        chunks.append(b"\r\n")
    chunks.append(b".\r\n")
    return b"".join(chunks)
