"""The client side of one SMQP connection, sans-IO: parses what a server sends (greeting,
replies, notifications) and serialises commands. Used by tests, benchmarks and the CLI.

Malformed server data raises ``ProtocolError``; the connection is then broken and every
later ``next_event`` raises the same error again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._reader import (
    CLOSED,
    DEFAULT_MAX_MESSAGE,
    NEED_DATA,
    TOO_LONG,
    Reader,
    Sentinel,
    decode_line,
)
from .commands import Command, serialize_command
from .errors import ProtocolError, bad_request
from .message import Message, parse_header_line
from .replies import NOTIFY_TOPIC_ACTIONS, Reply
from .values import parse_int, parse_timeout, validate_topic

__all__ = [
    "CLOSED",
    "NEED_DATA",
    "Challenge",
    "ClientConnection",
    "ClientEvent",
    "Greeting",
    "NotifyMessage",
    "NotifyServer",
    "NotifySub",
    "NotifySubscription",
    "NotifyTopic",
    "Reply",
    "ServerAck",
]


@dataclass(frozen=True, slots=True)
class Greeting:
    """``SMQP/<version> Ready. <ident>`` (``ready`` True) or ``... Not Available.``."""

    version: str
    ready: bool
    ident: str


@dataclass(slots=True)
class NotifyMessage:
    """``NOTIFY MESSAGE <topic>`` and its message (Created, Smuid, Cmuid among its headers);
    answer it with ``Ack()``."""

    topic: str
    message: Message


@dataclass(frozen=True, slots=True)
class NotifyTopic:
    """``NOTIFY TOPIC <topic>`` with ``Action: <action> [value]``; ``action`` is ADDED,
    RENAME, DELETED or KEYWORDS (abbreviations expanded)."""

    topic: str
    action: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class NotifySub:
    """``NOTIFY SUB <topic>`` with ``Count: <n>``."""

    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class NotifySubscription:
    """``NOTIFY SUBSCRIPTION <pattern>`` with ``Action: CANCELLED`` and ``Reason: lease |
    revoked | removed`` (profile §9.3)."""

    pattern: str
    action: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class NotifyServer:
    """``NOTIFY SERVER TIMEOUT <t>`` or ``NOTIFY SERVER BYE [t]`` (``timeout`` in seconds,
    None when BYE carries none)."""

    kind: str
    timeout: int | None


@dataclass(frozen=True, slots=True)
class Challenge:
    """``+ <base64>``: the server's step of a SCRAM exchange (profile §5), decoded by the
    client that asked for it."""

    data: str


@dataclass(frozen=True, slots=True)
class ServerAck:
    """The server's ``310 ACK`` closing a NOTIFY MESSAGE exchange."""


ClientEvent = (
    Greeting | Reply | NotifyMessage | NotifyTopic | NotifySub | NotifyServer | ServerAck | Sentinel
    | NotifySubscription | Challenge
)

_REPLY_RE = re.compile(r"([0-9]{3})(?:([- ])(.*))?")
_VERSION_RE = re.compile(r"[0-9]+\.[0-9]+")

_S_GREETING = 0
_S_IDLE = 1
_S_REPLY = 2  # inside a multi-line reply
_S_ATTRS = 3  # attribute lines of a NOTIFY TOPIC/SUB/SERVER block, until an empty line
_S_NOTIFY_MESSAGE = 4

_MESSAGE_WORDS = frozenset({"MESSAGE", "MESS", "MESSAGES"})
_TOPIC_WORDS = frozenset({"TOPIC", "TOPICS"})
_SUB_WORDS = frozenset({"SUBSCRIBERS", "SUBSCRIBER", "SUB"})
_SERVER_WORDS = frozenset({"SERVER", "SERV"})


def _take(s: str) -> tuple[str, str]:
    i = s.find(" ")
    if i < 0:
        return s, ""
    return s[:i], s[i + 1 :].lstrip(" ")


def _parse_greeting(text: str) -> Greeting:
    head, rest = _take(text)
    if head[:5].upper() != "SMQP/" or _VERSION_RE.fullmatch(head[5:]) is None:
        raise bad_request("not an SMQP greeting")
    low = rest.lower()
    if not rest:
        return Greeting(head[5:], True, "")
    if low.startswith("ready"):
        return Greeting(head[5:], True, rest[5:].lstrip(".").strip(" "))
    if low.startswith("not available"):
        return Greeting(head[5:], False, rest[13:].lstrip(".").strip(" "))
    raise bad_request("unknown greeting status")


class ClientConnection(Reader):
    """Parser of what a server sends.

    ``expect_greeting``: the first line is the greeting (False for a notification
    connection the server opened). ``max_line`` bounds one reply line (default 1 MiB: a
    LIST reply line may be long); ``max_message`` the data of one message block.
    """

    def __init__(
        self,
        *,
        expect_greeting: bool = True,
        max_line: int = 1024 * 1024,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_header_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        super().__init__(max_line, max_message, max_header_bytes)
        self._state = _S_GREETING if expect_greeting else _S_IDLE
        self._error: ProtocolError | None = None
        self._rcode = 0
        self._rlines: list[str] = []
        self._rmessages: list[Message] = []
        self._ntopic = ""
        self._nkind = ""
        self._nsub = ""
        self._ntimeout: int | None = None
        self._nattrs: dict[str, str] = {}

    def send(self, cmd: Command) -> bytes:
        """The bytes to send for a command (``serialize_command``)."""
        return serialize_command(cmd)

    def next_event(self) -> ClientEvent:
        """Return the next event, ``NEED_DATA`` or ``CLOSED``; raise ``ProtocolError`` for
        malformed server data."""
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ProtocolError as e:
            self._error = e
            raise

    def _next(self) -> ClientEvent:
        while True:
            if self._mstate:
                done = self._advance_message()
                if self._merror is not None:
                    raise self._merror
                if not done:
                    return self._need()
                headers, sections, _ = self._take_message()
                msg = Message(headers, sections)
                if self._state == _S_NOTIFY_MESSAGE:
                    self._state = _S_IDLE
                    return NotifyMessage(self._ntopic, msg)
                self._rmessages.append(msg)
                continue
            line = self._read_line()
            if line is None:
                return self._need()
            if line is TOO_LONG:
                raise bad_request("line too long")
            state = self._state
            if state == _S_ATTRS:
                if not line:
                    self._state = _S_IDLE
                    return self._notification()
                name, value = parse_header_line(decode_line(line))
                self._nattrs[name.lower()] = value
                continue
            text = decode_line(line)
            if state == _S_REPLY:
                m = _REPLY_RE.fullmatch(text)
                if m is None:
                    if not text:
                        raise bad_request("empty line inside a reply")
                    # A message block inside the reply (GET MESSAGE).
                    self._begin_message()
                    self._message_header(line)
                    continue
                code, sep, rest = m.groups()
                if int(code) != self._rcode:
                    raise bad_request("reply code changed inside a reply")
                self._rlines.append(rest or "")
                if sep == "-":
                    continue
                self._state = _S_IDLE
                reply = Reply(self._rcode, self._rlines, self._rmessages)
                self._rlines = []
                self._rmessages = []
                return reply
            if state == _S_GREETING:
                self._state = _S_IDLE
                return _parse_greeting(text)
            if not text:
                continue
            if text.startswith("+ "):
                return Challenge(text[2:].strip())
            m = _REPLY_RE.fullmatch(text)
            if m is not None:
                code, sep, rest = m.groups()
                if sep == "-":
                    self._state = _S_REPLY
                    self._rcode = int(code)
                    self._rlines = [rest]
                    self._rmessages = []
                    continue
                if code == "310":
                    return ServerAck()
                return Reply(int(code), [rest or ""])
            word, rest = _take(text)
            if word.upper() != "NOTIFY":
                raise bad_request("unexpected line from server")
            self._start_notification(rest)

    def _start_notification(self, rest: str) -> None:
        word, rest = _take(rest)
        kind = word.upper()
        if kind in _MESSAGE_WORDS or kind in _TOPIC_WORDS or kind in _SUB_WORDS:
            topic, extra = _take(rest)
            if extra:
                raise bad_request("unexpected argument")
            self._ntopic = validate_topic(topic)
            if kind in _MESSAGE_WORDS:
                self._state = _S_NOTIFY_MESSAGE
                self._begin_message()
                return
            self._nkind = "TOPIC" if kind in _TOPIC_WORDS else "SUB"
        elif kind == "SUBSCRIPTION":
            pattern, extra = _take(rest)
            if not pattern or extra:
                raise bad_request("bad subscription notification")
            self._ntopic = pattern
            self._nkind = "SUBSCRIPTION"
        else:
            if kind in _SERVER_WORDS:
                word, rest = _take(rest)
                kind = word.upper()
            # The draft's own example writes "NOTIFY BYE 00:05:00" without SERVER.
            if kind not in ("TIMEOUT", "BYE"):
                raise bad_request("unknown notification")
            value, extra = _take(rest)
            if extra or (kind == "TIMEOUT" and not value):
                raise bad_request("bad server notification")
            self._nkind = "SERVER"
            self._nsub = kind
            self._ntimeout = parse_timeout(value) if value else None
        self._nattrs = {}
        self._state = _S_ATTRS

    def _notification(self) -> NotifyTopic | NotifySub | NotifyServer | NotifySubscription:
        attrs = self._nattrs
        if self._nkind == "SERVER":
            return NotifyServer(self._nsub, self._ntimeout)
        if self._nkind == "SUBSCRIPTION":
            action = attrs.get("action")
            if action is None:
                raise bad_request("NOTIFY SUBSCRIPTION without Action")
            return NotifySubscription(self._ntopic, action.strip().upper(),
                                      attrs.get("reason"))
        if self._nkind == "SUB":
            count = attrs.get("count")
            if count is None:
                raise bad_request("NOTIFY SUB without Count")
            return NotifySub(self._ntopic, parse_int(count, minimum=0, what="count"))
        action = attrs.get("action")
        if action is None:
            raise bad_request("NOTIFY TOPIC without Action")
        word, value = _take(action)
        act = NOTIFY_TOPIC_ACTIONS.get(word.upper())
        if act is None:
            raise bad_request("unknown topic action")
        return NotifyTopic(self._ntopic, act, value or None)
