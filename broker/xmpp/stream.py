"""The server side of one XMPP-over-WebSocket stream (RFC 7395, RFC 6120), as a state
machine with no I/O: the door hands it each text frame and gets one event back; the
transitions are in :data:`ALLOWED`, h11-style.

States: ``opening`` (waiting for ``<open/>``) → ``auth`` (SASL) → ``reopening`` (the
``<open/>`` after ``<success/>``) → ``binding`` (only the bind / session IQs) → ``ready``
(stanzas) → ``closed``. Anything out of place ends the stream with the matching stream
error (:class:`Fault`), which the door writes with :func:`.stanzas.stream_error` and a
``<close/>``.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from xml.etree.ElementTree import Element

from . import stanzas as s
from .xml import StreamFault, parse_frame, split_tag

OPENING, AUTH, REOPENING, BINDING, READY, CLOSED = (
    "opening", "auth", "reopening", "binding", "ready", "closed")


@dataclass(slots=True)
class Opened:
    """The client opened (or re-opened) the stream: answer with ``frames`` (one element
    each: RFC 7395 §3.3.3)."""

    frames: list[str]


@dataclass(slots=True)
class AuthStart:
    mechanism: str
    initial: bytes | None  # None: no initial response; b"": an empty one ("=")


@dataclass(slots=True)
class AuthResponse:
    data: bytes


@dataclass(slots=True)
class AuthAbort:
    pass


@dataclass(slots=True)
class SaslFault:
    """A SASL element that is answered with ``<failure><condition/></failure>``."""

    condition: str


@dataclass(slots=True)
class Stanza:
    """An ``iq``, ``presence`` or ``message`` in ``jabber:client``."""

    kind: str
    element: Element


@dataclass(slots=True)
class Closed:
    pass


@dataclass(slots=True)
class Fault:
    """The stream ends with this stream error."""

    condition: str
    text: str = ""


# What each state accepts (anything else: the stream error beside it).
ALLOWED = {
    OPENING: ({"open"}, "not-authorized"),
    AUTH: ({"auth", "response", "abort", "close"}, "not-authorized"),
    REOPENING: ({"open", "close"}, "not-authorized"),
    BINDING: ({"iq", "close", "presence"}, "not-authorized"),
    READY: ({"iq", "presence", "message", "close"}, "unsupported-stanza-type"),
}
NAMESPACES = {"open": s.FRAMING, "close": s.FRAMING, "auth": s.SASL, "response": s.SASL,
              "abort": s.SASL, "iq": s.CLIENT, "presence": s.CLIENT, "message": s.CLIENT}


def plain_credentials(data: bytes, domain: str) -> tuple[str, str] | str:
    """The (username, password) of a SASL PLAIN message (RFC 4616: ``authzid NUL authcid NUL
    passwd``), or the SASL failure condition that refuses it: ``malformed-request``, or
    ``invalid-authzid`` when it asks to act as someone else than the user (bare or as
    ``user@domain``)."""
    parts = data.split(b"\0")
    if len(parts) != 3:
        return "malformed-request"
    try:
        authzid, username, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        return "malformed-request"
    if authzid and authzid.casefold() not in (username.casefold(),
                                              f"{username}@{domain}".casefold()):
        return "invalid-authzid"
    return username, password


def _decode(text: str | None) -> bytes | None:
    if text is None:
        return None
    text = text.strip()
    if text in ("", "="):
        return b""
    return base64.b64decode(text, validate=True)


class ServerStream:
    def __init__(self, domain: str, max_frame: int, mechanisms: list[str]) -> None:
        self.domain = domain
        self.max_frame = max_frame
        self.mechanisms = mechanisms
        self.state = OPENING
        self.stream_id = ""
        self._sasl_started = False

    def receive(self, frame: str | bytes) -> Opened | AuthStart | AuthResponse | AuthAbort | \
            SaslFault | Stanza | Closed | Fault | None:
        """The event of one frame (None: nothing to do, e.g. after the stream closed)."""
        if self.state == CLOSED:
            return None
        try:
            element = parse_frame(frame, self.max_frame)
            return self._event(element)
        except StreamFault as fault:
            self.state = CLOSED
            return Fault(fault.condition, fault.text)

    def _event(self, element: Element) -> Opened | AuthStart | AuthResponse | AuthAbort | \
            SaslFault | Stanza | Closed:
        ns, name = split_tag(element.tag)
        if name in ("iq", "presence", "message") and ns == "":
            ns = s.CLIENT  # a frame without the content namespace: jabber:client is meant
        expected = NAMESPACES.get(name)
        if expected is None:
            raise StreamFault("unsupported-stanza-type", name[:64])
        if ns != expected:
            raise StreamFault("invalid-namespace", f"{name} in {ns[:100]!r}")
        allowed, otherwise = ALLOWED[self.state]
        if name not in allowed:
            raise StreamFault(otherwise, f"{name} not allowed now")
        if name == "close":
            self.state = CLOSED
            return Closed()
        if name == "open":
            return self._open(element)
        if name == "auth":
            if self._sasl_started:
                return SaslFault("aborted")  # one exchange at a time
            mechanism = element.get("mechanism") or ""
            if mechanism not in self.mechanisms:
                return SaslFault("invalid-mechanism")
            try:
                initial = _decode(element.text)
            except (binascii.Error, ValueError):
                return SaslFault("incorrect-encoding")
            self._sasl_started = True
            return AuthStart(mechanism, initial)
        if name == "response":
            if not self._sasl_started:
                return SaslFault("aborted")
            try:
                return AuthResponse(_decode(element.text) or b"")
            except (binascii.Error, ValueError):
                self._sasl_started = False
                return SaslFault("incorrect-encoding")
        if name == "abort":
            self._sasl_started = False
            return AuthAbort()
        return Stanza(name, element)

    def _open(self, element: Element) -> Opened:
        to = element.get("to")
        if to is None or to.casefold() != self.domain.casefold():
            raise StreamFault("host-unknown", f"this server is {self.domain}")
        if element.get("version") != "1.0":
            raise StreamFault("unsupported-version", "version 1.0 only")
        self.stream_id = uuid.uuid4().hex
        reply = s.open_frame(self.domain, self.stream_id)
        if self.state == OPENING:
            self.state = AUTH
            return Opened([reply, s.features_before_auth(self.mechanisms)])
        self.state = BINDING
        return Opened([reply, s.features_after_auth()])

    # --------------------------------------------------------- the door's decisions

    def sasl_failed(self) -> None:
        """The exchange failed (the door wrote ``<failure/>``): a new one may start."""
        self._sasl_started = False

    def authenticated(self) -> None:
        """``<success/>`` was written: the client opens the stream again."""
        self._sasl_started = False
        self.state = REOPENING

    def bound(self) -> None:
        self.state = READY

    def fail(self) -> None:
        """The door ends the stream (a stream error of its own)."""
        self.state = CLOSED
