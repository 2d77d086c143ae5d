"""The SMQP listener: an asyncio TCP server that runs one ASGI application instance per
connection, as Daphne does for HTTP.

Each connection gets the scope ``{"type": "smqp", "client": [host, port], "server": [host,
port]}``. The application receives ``smqp.connect``, ``smqp.receive`` (``bytes``),
``smqp.shutdown`` (``grace``: seconds before the listener closes) and ``smqp.disconnect``;
it sends ``smqp.send`` (``bytes``) and ``smqp.close``. Nothing here knows SMQP itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("broker.server")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Any]

READ_SIZE = 256 * 1024
# Receive events buffered ahead of a busy application before reads pause (TCP backpressure).
INBOX_SIZE = 8


class _Connection:
    def __init__(self, server: SMQPServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.inbox: asyncio.Queue[dict] = asyncio.Queue(INBOX_SIZE)
        self.closed = False
        peer = writer.get_extra_info("peername") or ("", 0)
        sock = writer.get_extra_info("sockname") or ("", 0)
        self.scope = {
            "type": "smqp",
            "asgi": {"version": "3.0", "spec_version": "1.0"},
            "client": [peer[0], peer[1]],
            "server": [sock[0], sock[1]],
        }

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send(self, event: dict) -> None:
        kind = event["type"]
        if kind == "smqp.send":
            if self.closed:
                return
            if self.writer.is_closing():
                # The transport is gone already (the peer reset the connection): uvloop
                # refuses a write to it, where asyncio's transport ignores it.
                self._close_transport()
                return
            self.writer.write(event["bytes"])
            try:
                await self.writer.drain()
            except (ConnectionError, OSError):
                self._close_transport()
            if event.get("close"):
                self._close_transport()
        elif kind == "smqp.close":
            self._close_transport()
        else:
            raise ValueError(f"unknown event from the application: {kind!r}")

    def _close_transport(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()

    async def run(self, app: ASGIApp) -> None:
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        app_task = asyncio.ensure_future(app(self.scope, self.receive, self.send))
        await self.inbox.put({"type": "smqp.connect"})
        reader_task = asyncio.ensure_future(self._read_loop())
        try:
            done, _ = await asyncio.wait({app_task, reader_task},
                                         return_when=asyncio.FIRST_COMPLETED)
            if app_task in done:
                reader_task.cancel()
            else:
                # The peer is gone; give the application time to finish its disconnect.
                try:
                    await asyncio.wait_for(app_task, self.server.disconnect_timeout)
                except TimeoutError:
                    logger.warning("application did not stop after disconnect; cancelled")
            if app_task.done() and not app_task.cancelled() and app_task.exception():
                logger.error("SMQP application failed", exc_info=app_task.exception())
        finally:
            for task in (app_task, reader_task):
                if not task.done():
                    task.cancel()
            self._close_transport()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        try:
            while not self.closed:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                await self.inbox.put({"type": "smqp.receive", "bytes": data})
        except (ConnectionError, OSError):
            pass
        # The peer has finished sending (EOF, maybe only a half-close) or is gone. The
        # transport stays open: replies to what it sent are still written, then the
        # application's end closes it (run()).
        await self.inbox.put({"type": "smqp.disconnect"})


class SMQPServer:
    """Serve ``application`` on ``host:port``."""

    def __init__(self, application: ASGIApp, host: str, port: int, *,
                 reuse_port: bool = False, backlog: int = 1024,
                 disconnect_timeout: float = 10.0) -> None:
        self.application = application
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.backlog = backlog
        self.disconnect_timeout = disconnect_timeout
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> list[tuple[str, int]]:
        """Bind and start accepting; returns the bound addresses (port 0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=self.backlog,
            reuse_port=self.reuse_port or None, limit=READ_SIZE,
        )
        return [s.getsockname()[:2] for s in self._server.sockets]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.run(self.application)
        except asyncio.CancelledError:
            pass  # the listener is shutting down; the connection is closed with it
        except Exception:  # one connection's failure never stops the listener
            logger.exception("connection handler failed")
        finally:
            self.connections.discard(conn)

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, tell every connection (``smqp.shutdown``), wait up to ``grace``
        seconds for them to leave, then close what remains."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            with contextlib.suppress(asyncio.QueueFull):
                conn.inbox.put_nowait({"type": "smqp.shutdown", "grace": grace})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn._close_transport()
        deadline = loop.time() + self.disconnect_timeout
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._server is not None:
            await self._server.wait_closed()
