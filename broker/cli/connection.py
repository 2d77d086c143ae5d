"""A blocking SMQP connection for the ``smqp`` command: a socket (TLS with ``ssl``, the
standard library's) around the codec's sans-IO client (:class:`broker.smqp.client.
ClientConnection`), which does all the parsing. Hand-written because no maintained SMQP
client library exists; the codec is the project's own, shared with the server's tests."""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
from collections import deque

import scramp

from broker.smqp import commands as c
from broker.smqp.client import (
    CLOSED,
    NEED_DATA,
    Challenge,
    ClientConnection,
    ClientEvent,
    Greeting,
    NotifyMessage,
    Reply,
    ServerAck,
)
from broker.smqp.errors import ProtocolError
from broker.smqp.message import DataSection, Message


class CLIError(Exception):
    """One line for the user, and the exit status it means."""

    def __init__(self, text: str, status: int = 1) -> None:
        super().__init__(text)
        self.status = status


#: Exit statuses: a refused command, wrong usage (argparse's own), no connection or a broken
#: one, a failed login.
REFUSED, USAGE, CONNECTION, LOGIN = 1, 2, 3, 4


class Connection:
    """One logged-in SMQP session. ``command`` sends a line and returns its reply;
    notifications met meanwhile wait in ``pending``."""

    def __init__(self, host: str, port: int, *, tls: bool = False, cafile: str | None = None,
                 timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        try:
            raw = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise CLIError(f"cannot connect to {host}:{port}: {_reason(exc)}",
                           CONNECTION) from None
        if tls:
            context = ssl.create_default_context(cafile=cafile)
            try:
                raw = context.wrap_socket(raw, server_hostname=host)
            except (ssl.SSLError, OSError) as exc:
                raw.close()
                raise CLIError(f"TLS with {host}:{port} failed: {_reason(exc)}",
                               CONNECTION) from None
        self.sock = raw
        self.conn = ClientConnection()
        self.pending: deque[ClientEvent] = deque()
        self.send_lock = threading.Lock()
        try:
            greeting = self.next_event()
        except TimeoutError:
            self.close()
            hint = "" if tls else " (a TLS port? then --tls)"
            raise CLIError(f"no greeting from {host}:{port} within {timeout:g} s{hint}",
                           CONNECTION) from None
        if not isinstance(greeting, Greeting):
            raise CLIError(f"{host}:{port} is not an SMQP server", CONNECTION)
        if not greeting.ready:
            raise CLIError(f"{host}:{port} is not available: {greeting.ident}", CONNECTION)
        self.greeting = greeting
        self.guid = ""
        self.account = ""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------- events

    def next_event(self, timeout: float | None = None) -> ClientEvent:
        """The next event from the server; ``TimeoutError`` after ``timeout`` seconds of
        silence (None: the connection's own timeout)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            while True:
                try:
                    event = self.conn.next_event()
                except ProtocolError as exc:
                    raise CLIError(f"the server sent something malformed ({exc})",
                                   CONNECTION) from None
                if event is NEED_DATA:
                    try:
                        data = self.sock.recv(1 << 20)
                    except TimeoutError:
                        raise TimeoutError from None
                    except OSError as exc:
                        raise CLIError(f"connection lost: {_reason(exc)}", CONNECTION) from None
                    self.conn.receive_data(data)
                    continue
                if event is CLOSED:
                    raise CLIError("the server closed the connection", CONNECTION)
                return event
        finally:
            if timeout is not None:
                self.sock.settimeout(self.timeout)

    def send(self, data: bytes) -> None:
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except OSError as exc:
                raise CLIError(f"connection lost: {_reason(exc)}", CONNECTION) from None

    def reply(self) -> Reply:
        while True:
            event = self.next_event()
            if isinstance(event, Reply):
                return event
            if not isinstance(event, ServerAck):
                self.pending.append(event)

    def command(self, line: str) -> Reply:
        self.send(line.encode() + b"\r\n")
        return self.reply()

    def checked(self, line: str) -> Reply:
        """:meth:`command`, raising :class:`CLIError` for anything but 2xx."""
        reply = self.command(line)
        if not 200 <= reply.code < 300:
            raise CLIError(f"{line.split(' ', 2)[0]} refused: {describe(reply)}", REFUSED)
        return reply

    # ---------------------------------------------------------------------- verbs

    def login(self, account: str, password: str, method: str = "scram") -> None:
        """``scram``: SCRAM-SHA-256/1.0 (the password never crosses the wire; over TLS
        SCRAM-SHA-256-PLUS, bound to the server's certificate), or ``clear``: CLEAR/1.0
        (over TLS, or where the server allows it on plain TCP)."""
        self.account = account
        if method == "clear":
            reply = self.command(f"LOGIN {account} CLEAR/1.0")
            if reply.code != 200:
                raise CLIError(f"login as {account} refused: {describe(reply)}", LOGIN)
            reply = self.command(f"PASS {account} {password}")
        else:
            reply = self._scram_login(account, password)
        if reply.code != 200:
            raise CLIError(f"login as {account} failed: {describe(reply)}", LOGIN)
        for line in reply.lines:
            if line.startswith("Guid:"):
                self.guid = line[5:].strip()

    def _scram_login(self, account: str, password: str) -> Reply:
        """The client's side of a SCRAM exchange (scramp): ``LOGIN ... SCRAM-SHA-256/1.0``,
        ``200 +``, then base64 lines each way; the server must prove it knows the password
        too (its final ``+`` line), else the login fails here."""
        plus = isinstance(self.sock, ssl.SSLSocket)
        mechanism = "SCRAM-SHA-256-PLUS" if plus else "SCRAM-SHA-256"
        reply = self.command(f"LOGIN {account} {mechanism}/1.0")
        if reply.code != 200 or reply.lines[-1].strip() != "+":
            raise CLIError(f"login as {account} with {mechanism} refused: {describe(reply)}",
                           LOGIN)
        try:
            client = scramp.ScramClient(
                [mechanism], account, password,
                channel_binding=("tls-server-end-point", self.sock) if plus else None)
            self._raw(client.get_client_first())
            client.set_server_first(self._challenge(account))
            self._raw(client.get_client_final())
            client.set_server_final(self._challenge(account))
        except (scramp.ScramException, ValueError, UnicodeError) as exc:
            raise CLIError(f"login as {account} failed: {exc}", LOGIN) from None
        return self.reply()

    def _raw(self, text: str) -> None:
        self.send(base64.b64encode(text.encode()) + b"\r\n")

    def _challenge(self, account: str) -> str:
        """The server's next SCRAM step; its refusal (a reply) fails the login."""
        while True:
            event = self.next_event()
            if isinstance(event, Challenge):
                return base64.b64decode(event.data, validate=True).decode()
            if isinstance(event, Reply):
                raise CLIError(f"login as {account} failed: {describe(event)}", LOGIN)

    def publish(self, topic: str, cmuid: str, sections: list[tuple[str, bytes]],
                headers: list[tuple[str, str]] | None = None) -> Reply:
        msg = Message(list(headers or []),
                      [DataSection([("Content-Type", ct)], body) for ct, body in sections])
        try:
            data = c.serialize_command(c.Publish("MESSAGE", topic, cmuid, msg))
        except ValueError as exc:
            raise CLIError(f"cannot send that: {exc}", USAGE) from None
        self.send(data)
        return self.reply()

    def ack(self, smuid: int | None = None) -> None:
        """``310 ACK``: of the oldest message not yet acknowledged, or of ``smuid``."""
        self.send(c.serialize_command(c.Ack(smuid)))

    def notification(self, timeout: float | None = None) -> ClientEvent:
        if self.pending:
            return self.pending.popleft()
        return self.next_event(timeout)


def describe(reply: Reply) -> str:
    """A reply as one line: its code and its text lines."""
    text = " ".join(line for line in reply.lines if line) or "(no text)"
    return f"{reply.code} {text}"


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def message_dict(event: NotifyMessage | None, msg: Message, topic: str | None = None) -> dict:
    """A message as JSON-able values: headers, and each section's type and text (or,
    for bytes that are not UTF-8, base64)."""
    import base64

    sections = []
    for s in msg.sections:
        entry: dict = {"content_type": s.content_type, "length": len(s.body)}
        try:
            entry["text"] = s.body.decode()
        except UnicodeDecodeError:
            entry["base64"] = base64.b64encode(s.body).decode()
        sections.append(entry)
    return {
        "topic": event.topic if event is not None else (topic or msg.get("Topic")),
        "smuid": msg.get("Smuid"),
        "cmuid": msg.get("Cmuid"),
        "headers": [[k, v] for k, v in msg.headers],
        "sections": sections,
    }
