"""A deliberately plain blocking SMQP test client: raw bytes in, raw lines out, so tests can
assert the exact bytes on the wire."""

from __future__ import annotations

import re
import socket

from tests.support.timing import scaled

REPLY_END = re.compile(rb"^\d{3} ")


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=scaled(timeout))
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_line(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r\n")

    def read_line(self) -> bytes:
        """One line including its CRLF; b"" if the server closed first."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                line, self.buf = self.buf, b""
                return line
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def read_reply(self) -> list[bytes]:
        """All lines of one reply (through the ``CODE SP`` line), CRLFs included."""
        lines = []
        while True:
            line = self.read_line()
            if not line:
                raise ConnectionError(f"closed mid-reply after {lines!r}")
            lines.append(line)
            if REPLY_END.match(line):
                return lines

    def command(self, line: str) -> list[bytes]:
        self.send_line(line)
        return self.read_reply()

    def read_until_closed(self) -> bytes:
        data = self.buf
        self.buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return data
            data += chunk

    def login(self, user: str, password: str) -> list[bytes]:
        self.read_line()  # greeting
        assert self.command(f"LOGIN {user} CLEAR/1.0") == [b"200 OK\r\n"]
        reply = self.command(f"PASS {user} {password}")
        assert reply[-1].startswith(b"200 Guid: "), reply
        return reply
