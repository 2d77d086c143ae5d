"""Client commands of SMQP (draft section 4.1) as frozen dataclasses, their parser and their
serialiser.

Command and resource words are case-insensitive and take exactly the draft's abbreviations
(profile section 3); words are separated by one or more spaces. Every command class has a
``name`` class attribute (``"LIST TOPIC"``, ``"PUBLISH"`` ...) for dispatch and metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from .errors import ProtocolError, bad_request
from .message import Message, serialize_message
from .values import (
    SmuidSet,
    TopicPattern,
    format_datetime,
    format_keywords,
    format_timeout,
    parse_datetime,
    parse_int,
    parse_keywords,
    parse_smuid_list,
    parse_timeout,
    parse_topic_pattern,
    validate_topic,
)

__all__ = [
    "Ack",
    "Command",
    "Count",
    "CreateTopic",
    "FindTopic",
    "GetMessage",
    "GetTopicKeywords",
    "ListMessage",
    "ListTopic",
    "Login",
    "Noop",
    "Pass",
    "Publish",
    "PublishStart",
    "Quit",
    "RawLine",
    "RemoveMessage",
    "RemoveTopic",
    "Republish",
    "SetLogin",
    "SetNotifyPort",
    "SetNotifyResume",
    "SetNotifySuspend",
    "SetNotifyWindow",
    "SetTopicKeywords",
    "SetTopicName",
    "Subscribe",
    "Unsubscribe",
    "is_publish_line",
    "parse_command_line",
    "serialize_command",
]


# ------------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class Login:
    """``LOGIN <username> <method>/<version>``; ``method`` is upper-cased, ``version`` may
    be empty when the client left it out (the draft only says it SHOULD be given)."""

    name: ClassVar[str] = "LOGIN"
    username: str
    method: str
    version: str

    def _wire(self) -> str:
        mv = f"{self.method}/{self.version}" if self.version else self.method
        return f"LOGIN {self.username} {mv}"


@dataclass(frozen=True, slots=True)
class Pass:
    """``PASS <user> <secret>``: ``secret`` is the rest of the line after the first argument
    (it may hold spaces; for SET LOGIN PASSWORD it is ``<old> <new>``)."""

    name: ClassVar[str] = "PASS"
    user: str
    secret: str

    def _wire(self) -> str:
        return f"PASS {self.user} {self.secret}"


@dataclass(frozen=True, slots=True)
class Noop:
    """``NOOP``."""

    name: ClassVar[str] = "NOOP"

    def _wire(self) -> str:
        return "NOOP"


@dataclass(frozen=True, slots=True)
class Quit:
    """``QUIT``."""

    name: ClassVar[str] = "QUIT"

    def _wire(self) -> str:
        return "QUIT"


@dataclass(frozen=True, slots=True)
class Count:
    """``COUNT TOPIC|MESSAGE|SUBSCRIBERS <pattern>``; ``resource`` is the canonical word.
    ``COUNT TOPIC /`` (the root) is accepted."""

    name: ClassVar[str] = "COUNT"
    resource: str
    pattern: TopicPattern

    def _wire(self) -> str:
        return f"COUNT {self.resource} {self.pattern}"


@dataclass(frozen=True, slots=True)
class ListTopic:
    """``LIST TOPIC <topic>`` (``/`` allowed)."""

    name: ClassVar[str] = "LIST TOPIC"
    topic: str

    def _wire(self) -> str:
        return f"LIST TOPIC {self.topic}"


@dataclass(frozen=True, slots=True)
class ListMessage:
    """``LIST MESSAGE <topic>``."""

    name: ClassVar[str] = "LIST MESSAGE"
    topic: str

    def _wire(self) -> str:
        return f"LIST MESSAGE {self.topic}"


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """``CREATE TOPIC <topic> [(kw,...)] [> <target>]``."""

    name: ClassVar[str] = "CREATE TOPIC"
    topic: str
    keywords: tuple[str, ...] | None = None
    link: str | None = None

    def _wire(self) -> str:
        out = f"CREATE TOPIC {self.topic}"
        if self.keywords is not None:
            out += " " + format_keywords(self.keywords)
        if self.link is not None:
            out += f" > {self.link}"
        return out


@dataclass(frozen=True, slots=True)
class RemoveTopic:
    """``REMOVE TOPIC <topic>``."""

    name: ClassVar[str] = "REMOVE TOPIC"
    topic: str

    def _wire(self) -> str:
        return f"REMOVE TOPIC {self.topic}"


@dataclass(frozen=True, slots=True)
class RemoveMessage:
    """``REMOVE MESSAGE <topic> <smuid-list>``: an extension (profile §7, issue 22) that
    takes messages, state messages above all, out of a topic into its Trash."""

    name: ClassVar[str] = "REMOVE MESSAGE"
    topic: str
    smuids: SmuidSet

    def _wire(self) -> str:
        return f"REMOVE MESSAGE {self.topic} {self.smuids}"


@dataclass(frozen=True, slots=True)
class SetTopicName:
    """``SET TOPIC NAME <topic> <new-topic>``."""

    name: ClassVar[str] = "SET TOPIC NAME"
    topic: str
    new_topic: str

    def _wire(self) -> str:
        return f"SET TOPIC NAME {self.topic} {self.new_topic}"


@dataclass(frozen=True, slots=True)
class SetTopicKeywords:
    """``SET TOPIC KEYWORDS <topic> (kw,...)``."""

    name: ClassVar[str] = "SET TOPIC KEYWORDS"
    topic: str
    keywords: tuple[str, ...]

    def _wire(self) -> str:
        return f"SET TOPIC KEYWORDS {self.topic} {format_keywords(self.keywords)}"


@dataclass(frozen=True, slots=True)
class SetLogin:
    """``SET LOGIN PASSWORD|NAME|EMAIL|ADDRESS|PHONE <value>``.

    For PASSWORD the value is ``METHOD/version`` (method upper-cased); for the others it is
    the rest of the line without trailing spaces.
    """

    name: ClassVar[str] = "SET LOGIN"
    field: str
    value: str

    def _wire(self) -> str:
        return f"SET LOGIN {self.field} {self.value}"


@dataclass(frozen=True, slots=True)
class SetNotifyPort:
    """``SET NOTIFY PORT <port>`` (1-65535)."""

    name: ClassVar[str] = "SET NOTIFY PORT"
    port: int

    def _wire(self) -> str:
        return f"SET NOTIFY PORT {self.port}"


@dataclass(frozen=True, slots=True)
class SetNotifySuspend:
    """``SET NOTIFY SUSPEND``."""

    name: ClassVar[str] = "SET NOTIFY SUSPEND"

    def _wire(self) -> str:
        return "SET NOTIFY SUSPEND"


@dataclass(frozen=True, slots=True)
class SetNotifyResume:
    """``SET NOTIFY RESUME``."""

    name: ClassVar[str] = "SET NOTIFY RESUME"

    def _wire(self) -> str:
        return "SET NOTIFY RESUME"


@dataclass(frozen=True, slots=True)
class SetNotifyWindow:
    """``SET NOTIFY WINDOW <n>`` (profile §9.7): up to n NOTIFY MESSAGEs unacknowledged at
    once (n ≥ 1 here; the server's Max-Window is the services' check)."""

    name: ClassVar[str] = "SET NOTIFY WINDOW"
    window: int

    def _wire(self) -> str:
        return f"SET NOTIFY WINDOW {self.window}"


@dataclass(frozen=True, slots=True)
class FindTopic:
    """``FIND TOPIC <pattern> [(kw,...)]``."""

    name: ClassVar[str] = "FIND TOPIC"
    pattern: TopicPattern
    keywords: tuple[str, ...] | None = None

    def _wire(self) -> str:
        out = f"FIND TOPIC {self.pattern}"
        if self.keywords is not None:
            out += " " + format_keywords(self.keywords)
        return out


@dataclass(frozen=True, slots=True)
class Publish:
    """``PUBLISH MESSAGE|REPLY <topic> <cmuid>`` and its message."""

    name: ClassVar[str] = "PUBLISH"
    kind: str
    topic: str
    cmuid: str
    message: Message

    def _wire(self) -> str:
        return f"PUBLISH {self.kind} {self.topic} {self.cmuid}"


@dataclass(frozen=True, slots=True)
class PublishStart:
    """The command line of a PUBLISH whose message has not been read yet (parser internal
    step; ``ServerConnection`` turns it into a ``Publish``)."""

    name: ClassVar[str] = "PUBLISH"
    kind: str
    topic: str
    cmuid: str


@dataclass(frozen=True, slots=True)
class Republish:
    """``REPUBLISH MESSAGE <topic> <smuid>``."""

    name: ClassVar[str] = "REPUBLISH MESSAGE"
    topic: str
    smuid: int

    def _wire(self) -> str:
        return f"REPUBLISH MESSAGE {self.topic} {self.smuid}"


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``SUBSCRIBE MESSAGE|TOPIC|SUBSCRIBERS <pattern>`` (MESSAGE with an optional
    since-time, then optionally ``LEASE <timeout>`` and ``SELECTOR <class> <text>``, profile
    §9.2 / §9.3) or ``SUBSCRIBE SERVER TIMEOUT`` (``pattern`` None). ``lease`` in seconds
    (positive); ``selector`` is (class, text) as sent: the services check them."""

    name: ClassVar[str] = "SUBSCRIBE"
    resource: str
    pattern: TopicPattern | None
    since: datetime | None = None
    lease: int | None = None
    selector: tuple[str, str] | None = None

    def _wire(self) -> str:
        if self.resource == "SERVER":
            return "SUBSCRIBE SERVER TIMEOUT"
        out = f"SUBSCRIBE {self.resource} {self.pattern}"
        if self.since is not None:
            out += " " + format_datetime(self.since)
        if self.lease is not None:
            out += " LEASE " + format_timeout(self.lease)
        if self.selector is not None:
            out += f" SELECTOR {self.selector[0]} {self.selector[1]}"
        return out


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``UNSUBSCRIBE MESSAGE|TOPIC|SUBSCRIBERS <pattern|*>``, ``UNSUBSCRIBE *`` (resource
    ``"*"``, pattern ``TopicPattern("", True)``) or ``UNSUBSCRIBE SERVER TIMEOUT``
    (``pattern`` None); ``UNSUBSCRIBE MESSAGE <pattern> SELECTOR <class> <text>`` removes
    the one subscription with that selector (``selector`` (class, text))."""

    name: ClassVar[str] = "UNSUBSCRIBE"
    resource: str
    pattern: TopicPattern | None
    selector: tuple[str, str] | None = None

    def _wire(self) -> str:
        if self.resource == "*":
            return "UNSUBSCRIBE *"
        if self.resource == "SERVER":
            return "UNSUBSCRIBE SERVER TIMEOUT"
        if self.selector is not None:
            return (f"UNSUBSCRIBE {self.resource} {self.pattern} "
                    f"SELECTOR {self.selector[0]} {self.selector[1]}")
        return f"UNSUBSCRIBE {self.resource} {self.pattern}"


@dataclass(frozen=True, slots=True)
class GetMessage:
    """``GET MESSAGE <topic> <smuid-list>``."""

    name: ClassVar[str] = "GET MESSAGE"
    topic: str
    smuids: SmuidSet

    def _wire(self) -> str:
        return f"GET MESSAGE {self.topic} {self.smuids}"


@dataclass(frozen=True, slots=True)
class GetTopicKeywords:
    """``GET TOPIC KEYWORDS <topic>``."""

    name: ClassVar[str] = "GET TOPIC KEYWORDS"
    topic: str

    def _wire(self) -> str:
        return f"GET TOPIC KEYWORDS {self.topic}"


@dataclass(frozen=True, slots=True)
class Ack:
    """The client's ``310 ACK`` after a NOTIFY MESSAGE: of the oldest unacknowledged one, or
    with ``smuid`` of that one (``310 ACK <smuid>``, profile §9.7)."""

    name: ClassVar[str] = "ACK"
    smuid: int | None = None

    def _wire(self) -> str:
        return "310 ACK" if self.smuid is None else f"310 ACK {self.smuid}"


@dataclass(frozen=True, slots=True)
class RawLine:
    """A line taken verbatim (``ServerConnection.expect_raw_line``), e.g. a SCRAM step."""

    name: ClassVar[str] = "RAW"
    text: str

    def _wire(self) -> str:
        return self.text


Command = (
    Login
    | Pass
    | Noop
    | Quit
    | Count
    | ListTopic
    | ListMessage
    | CreateTopic
    | RemoveTopic
    | RemoveMessage
    | SetTopicName
    | SetTopicKeywords
    | SetLogin
    | SetNotifyPort
    | SetNotifySuspend
    | SetNotifyResume
    | SetNotifyWindow
    | FindTopic
    | Publish
    | Republish
    | Subscribe
    | Unsubscribe
    | GetMessage
    | GetTopicKeywords
    | Ack
    | RawLine
)


# ---------------------------------------------------------------------------------- parser

_RESOURCES = {
    "MESSAGE": "MESSAGE",
    "MESS": "MESSAGE",
    "MESSAGES": "MESSAGE",
    "TOPIC": "TOPIC",
    "TOPICS": "TOPIC",
    "SUBSCRIBERS": "SUBSCRIBERS",
    "SUBSCRIBER": "SUBSCRIBERS",
    "SUB": "SUBSCRIBERS",
    "SERVER": "SERVER",
    "SERV": "SERVER",
    "REPLY": "REPLY",
}
_KEYWORD_WORDS = frozenset({"KEYWORDS", "KEYWORD", "KEY"})
_LOGIN_FIELDS = {
    "PASSWORD": "PASSWORD",
    "PASS": "PASSWORD",
    "NAME": "NAME",
    "EMAIL": "EMAIL",
    "ADDRESS": "ADDRESS",
    "PHONE": "PHONE",
}
_PUBLISH_WORDS = frozenset({"PUB", "PUBLISH"})


def _take(s: str) -> tuple[str, str]:
    """Split off the first word; the rest loses its leading spaces."""
    i = s.find(" ")
    if i < 0:
        return s, ""
    return s[:i], s[i + 1 :].lstrip(" ")


def _missing() -> ProtocolError:
    return bad_request("missing argument")


def _word(rest: str) -> tuple[str, str]:
    word, rest = _take(rest)
    if not word:
        raise _missing()
    return word, rest


def _last(rest: str) -> str:
    """The one remaining argument; nothing may follow it."""
    word, rest = _take(rest)
    if not word:
        raise _missing()
    if rest:
        raise bad_request("unexpected argument")
    return word


def _end(rest: str) -> None:
    if rest:
        raise bad_request("unexpected argument")


def _resource(rest: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    word, rest = _word(rest)
    resource = _RESOURCES.get(word.upper())
    if resource not in allowed:
        raise bad_request("unknown resource")
    return resource, rest


def _split_keywords(rest: str) -> tuple[tuple[str, ...] | None, str]:
    if not rest.startswith("("):
        return None, rest
    close = rest.find(")")
    if close < 0:
        raise bad_request("invalid keywords")
    return parse_keywords(rest[: close + 1]), rest[close + 1 :].lstrip(" ")


def _method_version(word: str) -> tuple[str, str]:
    method, _, version = word.partition("/")
    if not method:
        raise bad_request("invalid authentication method")
    return method.upper(), version


def _p_login(rest: str) -> Login:
    user, rest = _word(rest)
    method, version = _method_version(_last(rest))
    return Login(user, method, version)


def _p_pass(rest: str) -> Pass:
    user, secret = _word(rest)
    if not secret:
        raise _missing()
    return Pass(user, secret)


def _p_noop(rest: str) -> Noop:
    _end(rest)
    return Noop()


def _p_quit(rest: str) -> Quit:
    _end(rest)
    return Quit()


def _p_count(rest: str) -> Count:
    resource, rest = _resource(rest, ("TOPIC", "MESSAGE", "SUBSCRIBERS"))
    pattern = parse_topic_pattern(_last(rest), allow_root=resource == "TOPIC")
    return Count(resource, pattern)


def _p_list(rest: str) -> ListTopic | ListMessage:
    resource, rest = _resource(rest, ("TOPIC", "MESSAGE"))
    if resource == "TOPIC":
        return ListTopic(validate_topic(_last(rest), allow_root=True))
    return ListMessage(validate_topic(_last(rest)))


def _p_create(rest: str) -> CreateTopic:
    _, rest = _resource(rest, ("TOPIC",))
    topic, rest = _word(rest)
    validate_topic(topic)
    keywords, rest = _split_keywords(rest)
    link = None
    if rest.startswith(">"):
        link = validate_topic(_last(rest[1:].lstrip(" ")))
        rest = ""
    _end(rest)
    return CreateTopic(topic, keywords, link)


def _p_remove(rest: str) -> RemoveTopic | RemoveMessage:
    resource, rest = _resource(rest, ("TOPIC", "MESSAGE"))
    if resource == "TOPIC":
        return RemoveTopic(validate_topic(_last(rest)))
    topic, rest = _word(rest)
    validate_topic(topic)
    if not rest:
        raise _missing()
    return RemoveMessage(topic, parse_smuid_list(rest.rstrip(" ")))


def _p_set(rest: str) -> Command:
    what, rest = _word(rest)
    what = what.upper()
    attr, rest = _word(rest)
    attr = attr.upper()
    if what in ("TOPIC", "TOPICS"):
        if attr == "NAME":
            topic, rest = _word(rest)
            return SetTopicName(validate_topic(topic), validate_topic(_last(rest)))
        if attr in _KEYWORD_WORDS:
            topic, rest = _word(rest)
            validate_topic(topic)
            if not rest:
                raise _missing()
            return SetTopicKeywords(topic, parse_keywords(rest.rstrip(" ")))
        raise bad_request("unknown topic attribute")
    if what == "LOGIN":
        field = _LOGIN_FIELDS.get(attr)
        if field is None:
            raise bad_request("unknown login attribute")
        if field == "PASSWORD":
            method, version = _method_version(_last(rest))
            return SetLogin(field, f"{method}/{version}" if version else method)
        value = rest.rstrip(" ")
        if not value:
            raise _missing()
        return SetLogin(field, value)
    if what == "NOTIFY":
        if attr == "PORT":
            port = parse_int(_last(rest), minimum=1, what="port")
            if port > 65535:
                raise bad_request("invalid port")
            return SetNotifyPort(port)
        if attr in ("SUSPEND", "SUS"):
            _end(rest)
            return SetNotifySuspend()
        if attr in ("RESUME", "RES"):
            _end(rest)
            return SetNotifyResume()
        if attr == "WINDOW":
            return SetNotifyWindow(parse_int(_last(rest), minimum=1, what="window"))
        raise bad_request("unknown notify attribute")
    raise bad_request("unknown resource")


def _p_find(rest: str) -> FindTopic:
    _, rest = _resource(rest, ("TOPIC",))
    word, rest = _word(rest)
    pattern = parse_topic_pattern(word)
    keywords, rest = _split_keywords(rest)
    _end(rest)
    return FindTopic(pattern, keywords)


def _p_publish(rest: str) -> PublishStart:
    kind, rest = _resource(rest, ("MESSAGE", "REPLY"))
    topic, rest = _word(rest)
    validate_topic(topic)
    return PublishStart(kind, topic, _last(rest))


def _p_republish(rest: str) -> Republish:
    _, rest = _resource(rest, ("MESSAGE",))
    topic, rest = _word(rest)
    validate_topic(topic)
    return Republish(topic, parse_int(_last(rest), minimum=1, what="smuid"))


def _server_attribute(rest: str) -> None:
    if _last(rest).upper() != "TIMEOUT":
        raise bad_request("unknown server attribute")


def _p_subscribe(rest: str) -> Subscribe:
    resource, rest = _resource(rest, ("MESSAGE", "TOPIC", "SUBSCRIBERS", "SERVER"))
    if resource == "SERVER":
        _server_attribute(rest)
        return Subscribe(resource, None, None)
    word, rest = _word(rest)
    pattern = parse_topic_pattern(word)
    since = lease = selector = None
    if rest:
        if resource != "MESSAGE":
            raise bad_request("unexpected argument")
        word, after = _take(rest)
        if word.upper() not in ("LEASE", "SELECTOR"):
            since = parse_datetime(word)
            rest = after
        word, after = _take(rest)
        if word.upper() == "LEASE":
            value, rest = _word(after)
            lease = parse_timeout(value)
            if lease <= 0:
                raise bad_request("a lease must be a positive timeout")
        selector, rest = _selector(rest)
        _end(rest)
    return Subscribe(resource, pattern, since, lease, selector)


def _selector(rest: str) -> tuple[tuple[str, str] | None, str]:
    """``SELECTOR <class> <text>``: the text runs to the end of the line (profile §9.2)."""
    word, after = _take(rest)
    if word.upper() != "SELECTOR":
        return None, rest
    cls, text = _word(after)
    if not text.strip():
        raise bad_request("missing selector text")
    return (cls, text.strip()), ""


def _p_unsubscribe(rest: str) -> Unsubscribe:
    word, after = _word(rest)
    if word == "*":
        _end(after)
        return Unsubscribe("*", TopicPattern("", True))
    resource, rest = _resource(rest, ("MESSAGE", "TOPIC", "SUBSCRIBERS", "SERVER"))
    if resource == "SERVER":
        _server_attribute(rest)
        return Unsubscribe(resource, None)
    word, rest = _word(rest)
    pattern = parse_topic_pattern(word, allow_bare_star=True)
    selector = None
    if rest and resource == "MESSAGE":
        selector, rest = _selector(rest)
    _end(rest)
    return Unsubscribe(resource, pattern, selector)


def _p_get(rest: str) -> GetMessage | GetTopicKeywords:
    resource, rest = _resource(rest, ("MESSAGE", "TOPIC"))
    if resource == "MESSAGE":
        topic, rest = _word(rest)
        validate_topic(topic)
        if not rest:
            raise _missing()
        return GetMessage(topic, parse_smuid_list(rest.rstrip(" ")))
    attr, rest = _word(rest)
    if attr.upper() not in _KEYWORD_WORDS:
        raise bad_request("unknown topic attribute")
    return GetTopicKeywords(validate_topic(_last(rest)))


def _p_ack(rest: str) -> Ack:
    # The word after 310 is not checked (a bare "310" was always taken as the ACK); an
    # argument after it names the message (a bare smuid, as smuids are in commands).
    _, rest = _take(rest)
    if not rest:
        return Ack()
    return Ack(parse_int(_last(rest), minimum=1, what="smuid"))


_PARSERS: dict[str, Callable[[str], Command | PublishStart]] = {
    "LOGIN": _p_login,
    "PASS": _p_pass,
    "PASSWORD": _p_pass,
    "NOOP": _p_noop,
    "QUIT": _p_quit,
    "COUNT": _p_count,
    "LIST": _p_list,
    "CREATE": _p_create,
    "REMOVE": _p_remove,
    "REM": _p_remove,
    "SET": _p_set,
    "FIND": _p_find,
    "PUBLISH": _p_publish,
    "PUB": _p_publish,
    "REPUBLISH": _p_republish,
    "REPUB": _p_republish,
    "SUBSCRIBE": _p_subscribe,
    "SUB": _p_subscribe,
    "UNSUBSCRIBE": _p_unsubscribe,
    "UNSUB": _p_unsubscribe,
    "GET": _p_get,
    "310": _p_ack,
}


def parse_command_line(line: str) -> Command | PublishStart:
    """Parse one command line (without its line ending).

    Returns a command, or a ``PublishStart`` for a PUBLISH line (whose message follows).
    Raises ``ProtocolError(400, "Bad request (unknown command)")`` for an unknown command
    word and ``ProtocolError(400, "Bad request (<reason>)")`` for bad arguments.
    """
    word, rest = _take(line.lstrip(" "))
    parser = _PARSERS.get(word.upper())
    if parser is None:
        raise bad_request("unknown command")
    return parser(rest)


def is_publish_line(line: bytes) -> bool:
    """True when a raw line starts with the PUB/PUBLISH command word (its message follows
    even when the rest of the line is bad)."""
    word = line.lstrip(b" ").split(b" ", 1)[0]
    return word.upper() in (b"PUB", b"PUBLISH")


def serialize_command(cmd: Command) -> bytes:
    """Serialise a command as the client sends it, with full words and CRLF; a ``Publish``
    includes its message framing. Raises ``ValueError`` if a field holds CR or LF."""
    line = cmd._wire()
    if "\n" in line or "\r" in line:
        raise ValueError("command field holds a line break")
    if isinstance(cmd, Publish):
        return (line + "\r\n").encode() + serialize_message(cmd.message)
    return (line + "\r\n").encode()
