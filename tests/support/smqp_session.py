"""A blocking SMQP test client built on the codec's sans-IO client: commands, publishes,
notifications and acknowledgements as objects, for tests that are about behaviour rather than
exact bytes (those use tests.support.smqp_client.RawClient)."""

from __future__ import annotations

import socket
from collections import deque

from broker.smqp import commands as c
from broker.smqp.client import ClientConnection, Greeting, NotifyMessage, ServerAck
from broker.smqp.connection import CLOSED, NEED_DATA
from broker.smqp.message import DataSection, Message
from broker.smqp.replies import Reply
from tests.support.timing import scaled


class Session:
    def __init__(self, host: str, port: int, user: str | None = None, password: str = "pw",
                 timeout: float = 15.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=scaled(timeout))
        self.conn = ClientConnection()
        self.pending: deque = deque()  # notifications seen while waiting for replies
        self.greeting = self._next()
        assert isinstance(self.greeting, Greeting)
        if user:
            assert self.command(f"LOGIN {user} CLEAR/1.0").code == 200
            reply = self.command(f"PASS {user} {password}")
            assert reply.code == 200, reply

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _next(self):
        while True:
            event = self.conn.next_event()
            if event is NEED_DATA:
                data = self.sock.recv(1 << 20)
                self.conn.receive_data(data)
                continue
            if event is CLOSED:
                raise ConnectionError("server closed the connection")
            return event

    def reply(self) -> Reply:
        while True:
            event = self._next()
            if isinstance(event, Reply):
                return event
            self.pending.append(event)

    def command(self, line: str) -> Reply:
        self.sock.sendall(line.encode() + b"\r\n")
        return self.reply()

    def publish(self, topic: str, cmuid: str, headers: list[tuple[str, str]] | None = None,
                sections: list[tuple[str, bytes]] | None = None, kind: str = "MESSAGE") -> Reply:
        self.send_publish(topic, cmuid, headers, sections, kind)
        return self.reply()

    def send_publish(self, topic: str, cmuid: str, headers=None, sections=None,
                     kind: str = "MESSAGE") -> None:
        if sections is None:
            sections = [("text/plain", cmuid.encode())]
        msg = Message(list(headers or []),
                      [DataSection([("Content-Type", ct)], body) for ct, body in sections])
        self.sock.sendall(c.serialize_command(c.Publish(kind, topic, cmuid, msg)))

    def notification(self, timeout: float = 15.0):
        """The next notification (of any kind)."""
        if self.pending:
            return self.pending.popleft()
        self.sock.settimeout(scaled(timeout))
        try:
            return self._next()
        finally:
            self.sock.settimeout(scaled(15.0))

    def message(self, timeout: float = 15.0) -> NotifyMessage:
        while True:
            event = self.notification(timeout)
            if isinstance(event, NotifyMessage):
                return event

    def ack(self) -> None:
        self.sock.sendall(b"310 ACK\r\n")
        while True:
            event = self._next()
            if isinstance(event, ServerAck):
                return
            self.pending.append(event)

    def quiet(self, wait: float = 1.0) -> bool:
        """True when no notification arrives within ``wait`` seconds (scaled: a longer quiet
        window under ``SMQP_TEST_SLOWDOWN`` is a stricter check)."""
        if self.pending:
            return False
        self.sock.settimeout(scaled(wait))
        try:
            event = self._next()
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(scaled(15.0))
        self.pending.append(event)
        return False


def smuid_of(reply: Reply) -> int:
    """``200 <cmuid> <smuid>`` → smuid."""
    assert reply.code == 200, reply
    return int(reply.lines[-1].split()[-1])


def header(msg: NotifyMessage, name: str) -> str | None:
    return msg.message.get(name)
