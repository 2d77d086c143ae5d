"""A small XMPP-over-WebSocket client for the tests (RFC 7395 frames over a real WebSocket,
with ``websocket-client``), and Daphne started as ``runbroker`` starts it.

It checks what the server sends rather than hiding it: every frame received is parsed and
kept, replies are matched by IQ id, notifications are collected in order.
"""

from __future__ import annotations

import base64
import itertools
import select
import ssl
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import websocket
from scramp import ScramClient

from tests.conftest import (
    BrokerProcess,
    fresh_listener,
)
from tests.conftest import (
    daphne as start_daphne,
)
from tests.support.timing import scaled

FRAMING = "urn:ietf:params:xml:ns:xmpp-framing"
SASL = "urn:ietf:params:xml:ns:xmpp-sasl"
BIND = "urn:ietf:params:xml:ns:xmpp-bind"
CLIENT = "jabber:client"
STREAMS = "urn:ietf:params:xml:ns:xmpp-streams"
STANZAS = "urn:ietf:params:xml:ns:xmpp-stanzas"
PUBSUB = "http://jabber.org/protocol/pubsub"
EVENT = PUBSUB + "#event"
QUEUEING = "urn:xmpp:pubsub:queueing:0"
SERVICE = "pubsub.localhost"


@contextmanager
def daphne(env: dict[str, str], base: Path) -> Iterator[str]:
    """Daphne serving ``broker.asgi_server`` (as ``runbroker`` does); yields the XMPP endpoint."""
    log_name = f"daphne-{uuid.uuid4().hex[:6]}.log"
    with start_daphne(env, base, log_name, timeout=90) as http:
        url = http.replace("http://", "ws://", 1) + "/xmpp-websocket"
        url_log[url] = base / log_name
        yield url


# The XMPP door's test settings: PLAIN on loopback, no lockout in the way of many logins, and
# 4096 PBKDF2 rounds (the least a SCRAM client, scramp, accepts).
XMPP_EXTRA = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "1000",
              "SMQP_PBKDF2_ITERATIONS": "4096"}


@contextmanager
def xmpp_stack(backend: str, base: Path, setup: str) -> Iterator[tuple[BrokerProcess, str]]:
    """A listener on a fresh database of ``backend``, ``setup`` run in it (once per test
    process: the database is a copy of a template made by it), and Daphne beside it: (the
    listener, Daphne's ws:// URL)."""
    with fresh_listener(backend, base, XMPP_EXTRA, setup=setup) as broker, \
            daphne(broker.env, base) as url:
        yield broker, url


url_log: dict[str, Path] = {}


def tag(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


class StreamEnded(Exception):
    pass


class XmppSession:
    """One stream. ``frames``: every element received, in order."""

    _ids = itertools.count(1)

    def __init__(self, url: str, timeout: float = 30.0, sslopt: dict | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.ws = websocket.create_connection(url, subprotocols=["xmpp"], timeout=scaled(timeout),
                                              sslopt=sslopt)
        self.frames: list[ET.Element] = []
        self.pending: list[ET.Element] = []  # received, not yet taken by an expect
        self.jid = ""

    # -- raw frames

    def send(self, text: str) -> None:
        self.ws.send(text)

    def _read(self, timeout: float) -> ET.Element:
        """The next frame within ``timeout`` (else ``WebSocketTimeoutException``). Control
        frames come back here: websocket-client's own loop answers a ping and reads on with
        a fresh socket timeout, so a wait longer than Daphne's ping interval (20 s) never
        ended while an expected frame was missing (the test hung instead of failing)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise websocket.WebSocketTimeoutException("no frame within the timeout")
            element = self._frame(left)
            if element is not None:
                return element

    def _frame(self, timeout: float) -> ET.Element | None:
        """One WebSocket frame: its element, or None for a ping (answered by recv_data
        already) or a pong."""
        self.ws.settimeout(timeout)
        try:
            opcode, data = self.ws.recv_data(control_frame=True)
        except (websocket.WebSocketConnectionClosedException, ConnectionError) as exc:
            raise StreamEnded(str(exc)) from exc
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            raise StreamEnded("websocket closed")
        if opcode in (websocket.ABNF.OPCODE_PING, websocket.ABNF.OPCODE_PONG):
            return None
        element = ET.fromstring(data)
        self.frames.append(element)
        return element

    def keepalive(self) -> None:
        """Read what has arrived, without waiting for more: websocket-client answers the
        server's pings only while it reads, and Daphne drops a stream whose ping goes
        unanswered for 30 s. A test that leaves this stream idle while it works elsewhere
        calls this now and then; the frames read wait in ``pending`` for an ``expect``."""
        sock = self.ws.sock
        while ((isinstance(sock, ssl.SSLSocket) and sock.pending())
               or select.select([sock], [], [], 0)[0]):
            element = self._frame(scaled(self.timeout))
            if element is not None:
                self.pending.append(element)

    def expect(self, match: Callable[[ET.Element], bool], timeout: float | None = None,
               what: str = "frame") -> ET.Element:
        """The first frame (already received or coming) that ``match`` accepts."""
        for i, element in enumerate(self.pending):
            if match(element):
                return self.pending.pop(i)
        deadline = time.monotonic() + scaled(timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within the timeout; pending: "
                                     + ", ".join(ET.tostring(e, "unicode")[:200]
                                                 for e in self.pending[-5:]))
            try:
                element = self._read(left)
            except websocket.WebSocketTimeoutException:
                continue
            if match(element):
                return element
            self.pending.append(element)

    def next_frame(self, timeout: float | None = None) -> ET.Element:
        return self.expect(lambda e: True, timeout)

    def closed(self, timeout: float = 30.0) -> bool:
        """Wait for the server's ``<close/>`` (RFC 7395 §3.6: the client then closes the
        WebSocket, as this does) or for the server to close the WebSocket itself; True when
        either came."""
        for i, element in enumerate(self.pending):
            if element.tag == tag(FRAMING, "close"):
                self.pending.pop(i)
                self.close()
                return True
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            try:
                element = self._read(deadline - time.monotonic())
                if element.tag == tag(FRAMING, "close"):
                    self.close()
                    return True
                self.pending.append(element)
            except StreamEnded:
                return True
            except websocket.WebSocketTimeoutException:
                return False
        return False

    def close(self) -> None:
        with suppress(Exception):
            self.ws.close()

    # -- stream set-up

    def open(self, domain: str = "localhost") -> ET.Element:
        self.send(f"<open xmlns='{FRAMING}' to='{domain}' version='1.0'/>")
        self.expect(lambda e: e.tag == tag(FRAMING, "open"), what="open")
        return self.expect(lambda e: e.tag == "{http://etherx.jabber.org/streams}features",
                           what="features")

    def auth_plain(self, user: str, password: str) -> ET.Element:
        data = base64.b64encode(f"\0{user}\0{password}".encode()).decode()
        self.send(f"<auth xmlns='{SASL}' mechanism='PLAIN'>{data}</auth>")
        return self.expect(lambda e: e.tag in (tag(SASL, "success"), tag(SASL, "failure")),
                           what="SASL outcome")

    def auth_scram(self, user: str, password: str) -> ET.Element:
        client = ScramClient(["SCRAM-SHA-256"], user, password)
        first = base64.b64encode(client.get_client_first().encode()).decode()
        self.send(f"<auth xmlns='{SASL}' mechanism='SCRAM-SHA-256'>{first}</auth>")
        reply = self.expect(lambda e: e.tag in (tag(SASL, "challenge"), tag(SASL, "failure")))
        if reply.tag == tag(SASL, "failure"):
            return reply
        client.set_server_first(base64.b64decode(reply.text or "").decode())
        final = base64.b64encode(client.get_client_final().encode()).decode()
        self.send(f"<response xmlns='{SASL}'>{final}</response>")
        reply = self.expect(lambda e: e.tag in (tag(SASL, "success"), tag(SASL, "failure")))
        if reply.tag == tag(SASL, "success"):
            client.set_server_final(base64.b64decode(reply.text or "").decode())
        return reply

    def login(self, user: str, password: str = "pw", resource: str | None = None,
              scram: bool = False) -> str:
        self.open()
        outcome = (self.auth_scram if scram else self.auth_plain)(user, password)
        assert outcome.tag == tag(SASL, "success"), ET.tostring(outcome, "unicode")
        self.open()
        res = f"<resource>{resource}</resource>" if resource else ""
        reply = self.iq("set", f"<bind xmlns='{BIND}'>{res}</bind>", to=None)
        assert reply.get("type") == "result", ET.tostring(reply, "unicode")
        self.jid = reply.find(f"{tag(BIND, 'bind')}/{tag(BIND, 'jid')}").text
        return self.jid

    # -- stanzas

    def send_iq(self, kind: str, inner: str, to: str | None = SERVICE) -> str:
        iq_id = f"t{next(self._ids)}"
        to_attr = f" to='{to}'" if to else ""
        self.send(f"<iq xmlns='{CLIENT}' type='{kind}' id='{iq_id}'{to_attr}>{inner}</iq>")
        return iq_id

    def reply(self, iq_id: str, timeout: float | None = None) -> ET.Element:
        return self.expect(lambda e: e.tag == tag(CLIENT, "iq") and e.get("id") == iq_id,
                           timeout, what=f"reply to {iq_id}")

    def iq(self, kind: str, inner: str, to: str | None = SERVICE,
           timeout: float | None = None) -> ET.Element:
        return self.reply(self.send_iq(kind, inner, to), timeout)

    def pubsub(self, kind: str, inner: str, owner: bool = False) -> ET.Element:
        ns = PUBSUB + "#owner" if owner else PUBSUB
        return self.iq(kind, f"<pubsub xmlns='{ns}'>{inner}</pubsub>")

    def event(self, kind: str = "item", timeout: float | None = None,
              node: str | None = None) -> tuple[str, ET.Element]:
        """The next pubsub event of ``kind`` (item, retract, unlock): (its node, the
        element)."""
        want = {"item": tag(EVENT, "item"), "retract": tag(EVENT, "retract"),
                "unlock": tag(QUEUEING, "unlock")}[kind]

        def match(e: ET.Element) -> bool:
            items = e.find(f"{tag(EVENT, 'event')}/{tag(EVENT, 'items')}")
            return (e.tag == tag(CLIENT, "message") and items is not None
                    and items.find(want) is not None
                    and (node is None or items.get("node") == node))

        message = self.expect(match, timeout, what=f"{kind} event")
        items = message.find(f"{tag(EVENT, 'event')}/{tag(EVENT, 'items')}")
        return items.get("node"), items.find(want)


def error_condition(reply: ET.Element) -> str | None:
    """The stanza error condition of an IQ error (None for a result)."""
    error = reply.find(tag(CLIENT, "error"))
    if error is None:
        return None
    for child in error:
        if child.tag.startswith("{" + STANZAS + "}") and not child.tag.endswith("}text"):
            return child.tag.split("}")[1]
    return "?"


def stream_error_condition(session: XmppSession, timeout: float = 30.0) -> str:
    element = session.expect(lambda e: e.tag == "{http://etherx.jabber.org/streams}error",
                             timeout, what="stream error")
    for child in element:
        if child.tag.startswith("{" + STREAMS + "}") and not child.tag.endswith("}text"):
            return child.tag.split("}")[1]
    return "?"
