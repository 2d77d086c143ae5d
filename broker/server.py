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
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("broker.server")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Any]

# Receive events buffered ahead of a busy application before reads pause (TCP backpressure).
INBOX_SIZE = 8


class _Connection(asyncio.Protocol):
    """One TCP connection as an ASGI application instance's ``receive`` and ``send``.

    A protocol rather than a stream reader and a task that reads it: what the socket
    delivers is handed to the application from the transport's callback, so that each
    incoming chunk (a subscriber's ``310 ACK``) costs the event loop one task step, the
    application's, not two."""

    def __init__(self, server: SMQPServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.inbox: deque[dict] = deque()
        self._receiver: asyncio.Future[None] | None = None  # the application waits for input
        self._reading_paused = False
        self._writing_paused = False
        self._drainers: list[asyncio.Future[None]] = []
        self._lost = False
        self._disconnected = False
        self.closed = False
        self.scope: dict = {}
        self._run: asyncio.Task | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.scope = {
            "type": "smqp",
            "asgi": {"version": "3.0", "spec_version": "1.0"},
            "client": [peer[0], peer[1]],
            "server": [local[0], local[1]],
        }
        self.server.connections.add(self)
        self._deliver({"type": "smqp.connect"})  # before anything the socket brings
        self._run = asyncio.ensure_future(self.run(self.server.application))

    def data_received(self, data: bytes) -> None:
        self._deliver({"type": "smqp.receive", "bytes": data})
        if len(self.inbox) >= INBOX_SIZE and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        # The peer has finished sending (maybe only a half-close). The transport stays open:
        # replies to what it sent are still written, then the application's end closes it.
        self._peer_gone()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.closed = True
        self._peer_gone()
        self._release_drainers(exc)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._release_drainers(None)

    # ------------------------------------------------------------------ ASGI side

    def _deliver(self, event: dict) -> None:
        self.inbox.append(event)
        waiter = self._receiver
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _peer_gone(self) -> None:
        if self._disconnected:
            return
        self._disconnected = True
        self._deliver({"type": "smqp.disconnect"})
        # The application gets time to finish its disconnect, then it is cancelled.
        asyncio.get_running_loop().call_later(self.server.disconnect_timeout, self._overdue)

    def _overdue(self) -> None:
        if self._run is not None and not self._run.done():
            logger.warning("application did not stop after disconnect; cancelled")
            self._run.cancel()

    async def receive(self) -> dict:
        while not self.inbox:
            self._receiver = asyncio.get_running_loop().create_future()
            try:
                await self._receiver
            finally:
                self._receiver = None
        event = self.inbox.popleft()
        if self._reading_paused and len(self.inbox) < INBOX_SIZE // 2:
            self._reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        return event

    def put_nowait(self, event: dict) -> None:
        """An event from the listener itself (``smqp.shutdown``)."""
        self._deliver(event)

    async def send(self, event: dict) -> None:
        kind = event["type"]
        if kind == "smqp.send":
            transport = self.transport
            if self.closed or transport is None:
                return
            if transport.is_closing():
                # The transport is gone already (the peer reset the connection): uvloop
                # refuses a write to it, where asyncio's transport ignores it.
                self._close_transport()
                return
            transport.write(event["bytes"])
            if self._writing_paused:
                try:
                    await self._drained()
                except (ConnectionError, OSError):
                    self._close_transport()
            if event.get("close"):
                self._close_transport()
        elif kind == "smqp.close":
            self._close_transport()
        else:
            raise ValueError(f"unknown event from the application: {kind!r}")

    async def _drained(self) -> None:
        if self._lost:
            raise ConnectionResetError("connection lost")
        waiter = asyncio.get_running_loop().create_future()
        self._drainers.append(waiter)
        await waiter

    def _release_drainers(self, exc: Exception | None) -> None:
        drainers, self._drainers = self._drainers, []
        for waiter in drainers:
            if waiter.done():
                continue
            if self._lost:
                waiter.set_exception(exc or ConnectionResetError("connection lost"))
            else:
                waiter.set_result(None)

    def _close_transport(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    async def run(self, app: ASGIApp) -> None:
        try:
            try:
                await app(self.scope, self.receive, self.send)
            except asyncio.CancelledError:
                pass  # the listener is shutting down; the connection is closed with it
            except Exception:  # one connection's failure never stops the listener
                logger.error("SMQP application failed", exc_info=True)
        finally:
            self._close_transport()
            self.server.connections.discard(self)


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
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), self.host, self.port, backlog=self.backlog,
            reuse_port=self.reuse_port or None,
        )
        return [s.getsockname()[:2] for s in self._server.sockets]

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, tell every connection (``smqp.shutdown``), wait up to ``grace``
        seconds for them to leave, then close what remains."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.put_nowait({"type": "smqp.shutdown", "grace": grace})
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
