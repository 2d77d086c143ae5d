"""What the server writes: replies (profile section 2), the greeting, GET MESSAGE blocks and
notifications (profile sections 6 and 7)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .message import Message, serialize_message
from .values import format_timeout

__all__ = [
    "NOTIFY_TOPIC_ACTIONS",
    "Reply",
    "error",
    "ok",
    "serialize_ack",
    "serialize_get_blocks",
    "serialize_get_reply",
    "serialize_greeting",
    "serialize_not_available",
    "serialize_notify_message",
    "serialize_notify_server_bye",
    "serialize_notify_server_timeout",
    "serialize_notify_sub",
    "serialize_notify_subscription",
    "serialize_notify_topic",
    "serialize_reply",
]

# Action words of NOTIFY TOPIC and their abbreviations (profile section 3).
NOTIFY_TOPIC_ACTIONS = {
    "ADDED": "ADDED",
    "ADD": "ADDED",
    "RENAME": "RENAME",
    "REN": "RENAME",
    "DELETED": "DELETED",
    "DEL": "DELETED",
    "KEYWORDS": "KEYWORDS",
    "KEYWORD": "KEYWORDS",
    "KEY": "KEYWORDS",
}


@dataclass(slots=True)
class Reply:
    """A complete reply: its code and the text of each line. ``messages`` holds the message
    blocks met inside a multi-line reply (GET MESSAGE), Topic/Smuid/Cmuid as headers."""

    code: int
    lines: list[str]
    messages: list[Message] = field(default_factory=list)

    def serialize(self) -> bytes:
        """The reply as bytes (message blocks are not included; see serialize_get_reply)."""
        return serialize_reply(self.code, self.lines)


def _check(text: str) -> str:
    if "\n" in text or "\r" in text:
        raise ValueError("reply text holds a line break")
    return text


def serialize_reply(code: int, lines: str | Sequence[str]) -> bytes:
    """``CODE SP text`` for one line; ``CODE-text`` for all lines but the last of several.

    ``lines`` is one string or a non-empty sequence of strings. Raises ``ValueError`` for a
    code outside 100-999, no lines, or a line holding CR or LF.
    """
    if not 100 <= code <= 999:
        raise ValueError(f"reply code out of range: {code}")
    if isinstance(lines, str):
        lines = (lines,)
    if not lines:
        raise ValueError("a reply needs at least one line")
    if len(lines) == 1:
        return f"{code} {_check(lines[0])}\r\n".encode()
    head = "".join(f"{code}-{_check(t)}\r\n" for t in lines[:-1])
    return f"{head}{code} {_check(lines[-1])}\r\n".encode()


def ok() -> bytes:
    """``200 OK``."""
    return b"200 OK\r\n"


class Refused(Protocol):
    """A refusal as SMQP words it: a ``ProtocolError``, or a services' ``ServiceError``
    (whose ``code`` is its Refusal's SMQP code)."""

    @property
    def code(self) -> int: ...

    @property
    def text(self) -> str: ...


def error(exc: Refused) -> bytes:
    """The one-line reply for a refusal (``400 Bad request (...)``): the SMQP door's one
    mapping of errors to the wire."""
    return serialize_reply(exc.code, exc.text)


def serialize_ack() -> bytes:
    """The server's ``310 ACK`` that completes a NOTIFY MESSAGE exchange."""
    return b"310 ACK\r\n"


def serialize_greeting(ident: str) -> bytes:
    """``SMQP/1.0 Ready. <ident>`` CRLF (just ``SMQP/1.0 Ready.`` for an empty ident)."""
    _check(ident)
    return f"SMQP/1.0 Ready. {ident}\r\n".encode() if ident else b"SMQP/1.0 Ready.\r\n"


def serialize_not_available() -> bytes:
    """``SMQP/1.0 Not Available.`` CRLF; the server then closes."""
    return b"SMQP/1.0 Not Available.\r\n"


_ID_HEADERS = frozenset({"Topic", "Smuid", "Cmuid"})


def _block_headers(
    msg: Message, topic: str | None, smuid_hdr: str, cmuid_hdr: str
) -> tuple[list[tuple[str, str]], Message]:
    """Headers for a delivered message: [Topic,] Created, Smuid, Cmuid, then the rest.

    Any Topic/Smuid/Cmuid already among the stored headers (a PUB REPLY names the message
    it answers that way) is replaced by the given values, so each appears once.
    """
    created = None
    rest: list[tuple[str, str]] = []
    for k, v in msg.headers:
        if k == "Created" and created is None:
            created = v
        elif k not in _ID_HEADERS:
            rest.append((k, v))
    prefix: list[tuple[str, str]] = []
    if topic is not None:
        prefix.append(("Topic", topic))
    if created is not None:
        prefix.append(("Created", created))
    prefix.append(("Smuid", smuid_hdr))
    prefix.append(("Cmuid", cmuid_hdr))
    return prefix, Message(rest, msg.sections)


def serialize_get_reply(messages: Iterable[tuple[str, str, str, Message]]) -> bytes:
    """The GET MESSAGE reply: ``200-OK``, each message as a block (``Topic:``, ``Created:``,
    ``Smuid:``, ``Cmuid:``, the other headers, empty line, data sections, ``.``), then
    ``200 <n> messages``. Each item is ``(topic, smuid_hdr, cmuid_hdr, message)``."""
    items = list(messages)
    return b"200-OK\r\n" + serialize_get_blocks(items) + f"200 {len(items)} messages\r\n".encode()


def serialize_get_blocks(messages: Iterable[tuple[str, str, str, Message]]) -> bytes:
    """The message blocks of a GET MESSAGE reply (a server writes a long reply in parts:
    ``200-OK``, blocks, more blocks, ``200 <n> messages``)."""
    chunks = []
    for topic, smuid_hdr, cmuid_hdr, msg in messages:
        prefix, body = _block_headers(msg, topic, smuid_hdr, cmuid_hdr)
        chunks.append(serialize_message(body, prefix_headers=prefix))
    return b"".join(chunks)


def serialize_notify_message(topic: str, smuid_hdr: str, cmuid_hdr: str, msg: Message) -> bytes:
    """``NOTIFY MESSAGE <topic>``, then the headers (Created, Smuid, Cmuid, the rest), an
    empty line, the data sections and ``.``. The client answers ``310 ACK``."""
    prefix, body = _block_headers(msg, None, smuid_hdr, cmuid_hdr)
    return f"NOTIFY MESSAGE {_check(topic)}\r\n".encode() + serialize_message(
        body, prefix_headers=prefix
    )


def serialize_notify_topic(
    topic: str, action: str, value: str | Iterable[str] | None = None
) -> bytes:
    """``NOTIFY TOPIC <topic>``, ``Action: <ACTION> [value]``, empty line.

    ``action`` is ADDED, RENAME (value: the new topic), DELETED or KEYWORDS (value: the
    keywords, as ``kw,kw`` or an iterable); abbreviations are accepted.
    """
    act = NOTIFY_TOPIC_ACTIONS.get(action.upper())
    if act is None:
        raise ValueError(f"unknown topic action: {action}")
    if value is not None and not isinstance(value, str):
        value = ",".join(value)
    line = f"Action: {act} {value}" if value else f"Action: {act}"
    return f"NOTIFY TOPIC {_check(topic)}\r\n{_check(line)}\r\n\r\n".encode()


def serialize_notify_sub(topic: str, count: int) -> bytes:
    """``NOTIFY SUB <topic>``, ``Count: <n>``, empty line."""
    return f"NOTIFY SUB {_check(topic)}\r\nCount: {int(count)}\r\n\r\n".encode()


def serialize_notify_subscription(pattern: str, action: str, reason: str) -> bytes:
    """``NOTIFY SUBSCRIPTION <pattern>``, ``Action: <action>``, ``Reason: <reason>``, empty
    line (profile §9.3: a subscription ended other than by the account's UNSUB)."""
    return (f"NOTIFY SUBSCRIPTION {_check(pattern)}\r\nAction: {_check(action)}\r\n"
            f"Reason: {_check(reason)}\r\n\r\n").encode()


def serialize_notify_server_timeout(seconds: int) -> bytes:
    """``NOTIFY SERVER TIMEOUT <timeout>``, empty line."""
    return f"NOTIFY SERVER TIMEOUT {format_timeout(seconds)}\r\n\r\n".encode()


def serialize_notify_server_bye(seconds: int | None = None) -> bytes:
    """``NOTIFY SERVER BYE [timeout]``, empty line."""
    if seconds is None:
        return b"NOTIFY SERVER BYE\r\n\r\n"
    return f"NOTIFY SERVER BYE {format_timeout(seconds)}\r\n\r\n".encode()
