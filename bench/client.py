"""A small asyncio SMQP client for benchmarks.

It speaks just enough of the protocol (profile §1, §2, §5, §6) to drive load: read the greeting,
log in with ``CLEAR/1.0``, send command lines (pipelined if wanted) and read replies. A reply
ends at the first line ``CODE SP ...``; ``CODE-...`` lines continue it. ``NOTIFY ...`` blocks
that arrive between replies are read whole and kept in :attr:`SMQPClient.notifications`
(a NOTIFY MESSAGE is framed by its header, its Content-Length data sections and a ``.`` line;
the other notifications end with an empty line). Nothing is ACKed automatically.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
from collections import deque
from dataclasses import dataclass, field

REPLY_LINE = re.compile(r"^(\d{3})([ -])(.*)$")


class SMQPProtocolError(Exception):
    """The server sent something this client cannot frame, or closed mid-reply."""


class SMQPCommandError(Exception):
    """A command that had to succeed (login) got a non-200 reply."""

    def __init__(self, command: str, reply: Reply) -> None:
        super().__init__(f"{command!r} -> {reply.lines!r}")
        self.command = command
        self.reply = reply


@dataclass
class Reply:
    """One SMQP reply: its code and its lines (without CRLF)."""

    code: int
    lines: list[str]

    @property
    def ok(self) -> bool:
        return self.code == 200

    @property
    def last_text(self) -> str:
        """The text of the final ``CODE SP text`` line."""
        return self.lines[-1][4:]

    @property
    def texts(self) -> list[str]:
        """The text of every line, without its ``CODE-`` / ``CODE `` prefix."""
        return [line[4:] for line in self.lines]


@dataclass
class Notification:
    """A ``NOTIFY ...`` block: its lines, and for NOTIFY MESSAGE its data sections."""

    first_line: str
    lines: list[str]
    data: list[bytes] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """``MESSAGE``, ``TOPIC``, ``SUB`` or ``SERVER``."""
        parts = self.first_line.split()
        return parts[1].upper() if len(parts) > 1 else ""


@functools.lru_cache(maxsize=4)
def tls_context(ca_file: str) -> ssl.SSLContext:
    """A client TLS context trusting ``ca_file`` (made once per process and CA)."""
    return ssl.create_default_context(cafile=ca_file)


class SMQPClient:
    """One SMQP connection. Create with :meth:`connect`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 greeting: str) -> None:
        self.reader = reader
        self.writer = writer
        self.greeting = greeting
        self.notifications: deque[Notification] = deque(maxlen=1000)
        self.notification_count = 0
        self.guid: str | None = None

    @classmethod
    async def connect(cls, host: str, port: int, *, timeout: float = 30,
                      tls_ca: str = "") -> SMQPClient:
        """Open a connection and read the greeting (``SMQP/1.0 Ready. ...``); over TLS
        (SMQPS) when ``tls_ca`` names the CA file that signed the server's certificate."""
        tls = tls_context(tls_ca) if tls_ca else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=1 << 20, ssl=tls,
                                    server_hostname="localhost" if tls else None), timeout)
        raw = await asyncio.wait_for(reader.readline(), timeout)
        greeting = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not greeting.startswith("SMQP/1.0 Ready."):
            writer.close()
            raise SMQPProtocolError(f"unexpected greeting {greeting!r}")
        return cls(reader, writer, greeting)

    # ------------------------------------------------------------------------------ sending

    def write_line(self, line: str) -> None:
        """Queue one command line (CRLF added); call :meth:`drain` to flush."""
        self.writer.write(line.encode("utf-8") + b"\r\n")

    async def drain(self) -> None:
        await self.writer.drain()

    async def send_line(self, line: str) -> None:
        self.write_line(line)
        await self.writer.drain()

    # ------------------------------------------------------------------------------ reading

    async def _line(self) -> str:
        raw = await self.reader.readline()
        if not raw:
            raise SMQPProtocolError("connection closed by the server")
        return raw.decode("utf-8", "replace").rstrip("\r\n")

    async def _read_notification(self, first: str) -> Notification:
        note = Notification(first, [first])
        if note.kind != "MESSAGE":
            while True:  # other notifications end with an empty line
                line = await self._line()
                if not line:
                    return note
                note.lines.append(line)
        while True:  # message header, ends with an empty line
            line = await self._line()
            note.lines.append(line)
            if not line:
                break
        while True:  # data sections, then "."
            line = await self._line()
            note.lines.append(line)
            if line == ".":
                return note
            length = None
            while line:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
                line = await self._line()
                note.lines.append(line)
            if length is None:
                raise SMQPProtocolError(f"data section without Content-Length: {note.lines!r}")
            note.data.append(await self.reader.readexactly(length))
            await self._line()  # the CRLF after the data

    async def read_reply(self) -> Reply:
        """The next reply, skipping (and keeping) any notifications before it."""
        lines: list[str] = []
        while True:
            line = await self._line()
            if not lines:
                if not line:
                    continue  # tolerate stray empty lines between replies
                if line.startswith("NOTIFY "):
                    self.notifications.append(await self._read_notification(line))
                    self.notification_count += 1
                    continue
            match = REPLY_LINE.match(line)
            if match is None:
                raise SMQPProtocolError(f"not a reply line {line!r} after {lines!r}")
            lines.append(line)
            if match[2] == " ":
                return Reply(int(match[1]), lines)

    async def command(self, line: str) -> Reply:
        """Send one command line and return its reply."""
        await self.send_line(line)
        return await self.read_reply()

    # ------------------------------------------------------------------------------ session

    async def login(self, user: str, password: str) -> Reply:
        """``LOGIN user CLEAR/1.0`` + ``PASS user password``; raises on a non-200 reply."""
        reply = await self.command(f"LOGIN {user} CLEAR/1.0")
        if not reply.ok:
            raise SMQPCommandError(f"LOGIN {user} CLEAR/1.0", reply)
        reply = await self.command(f"PASS {user} {password}")
        if not reply.ok:
            raise SMQPCommandError(f"PASS {user} ***", reply)
        if reply.last_text.startswith("Guid: "):
            self.guid = reply.last_text[6:]
        return reply

    async def quit(self, *, timeout: float = 5) -> None:
        """``QUIT`` (best effort) and close."""
        with contextlib.suppress(OSError, SMQPProtocolError, TimeoutError):
            await asyncio.wait_for(self.command("QUIT"), timeout)
        await self.close()

    async def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()
