"""The SMQP listener: an asyncio TCP server that runs one ASGI application instance per
connection, as Daphne does for HTTP. QQP's listener is the same server with ``protocol="qqp"``:
its scope type and event names then start with ``qqp`` instead of ``smqp``.

Each connection gets the scope ``{"type": "smqp", "client": [host, port], "server": [host,
port], "tls": None}``; on a TLS listener (SMQPS) ``tls`` is ``{"server_cert": <DER bytes>}``,
the certificate the listener presents (for SCRAM's ``tls-server-end-point`` binding).
The application receives ``smqp.connect``, ``smqp.receive`` (``bytes``), ``smqp.shutdown``
(``grace``: seconds before the listener closes) and ``smqp.disconnect``; it sends
``smqp.send`` (``bytes``) and ``smqp.close``. Nothing here knows SMQP itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("broker.server")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Any]

# Receive events buffered ahead of a busy application before reads pause (TCP backpressure).
INBOX_SIZE = 8


class TLSConfigError(Exception):
    """The configured certificate or key cannot be used; the message says which and why."""


def load_tls_certificate(cert: str, key: str) -> tuple[ssl.SSLContext, bytes]:
    """A server TLS context (TLS 1.2 minimum) presenting ``cert`` (PEM, may hold the chain)
    with ``key``, and the certificate's DER bytes. :class:`TLSConfigError` tells what is
    wrong: a missing file, an unreadable one, or a key that does not match the certificate."""
    for what, path in (("certificate", cert), ("key", key)):
        if not path:
            raise TLSConfigError(f"SMQPS: no TLS {what} file configured")
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TLSConfigError(f"SMQPS: cannot read the TLS {what} {path!r}: "
                                 f"{exc.strerror or exc}") from exc
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc.reason or exc):
            raise TLSConfigError(f"SMQPS: the key {key!r} does not match the certificate "
                                 f"{cert!r}") from exc
        raise TLSConfigError(f"SMQPS: cannot load the certificate {cert!r} with the key "
                             f"{key!r}: {exc.reason or exc}") from exc
    with open(cert, encoding="ascii", errors="replace") as file:
        pem = file.read()
    end = pem.find("-----END CERTIFICATE-----")
    start = pem.rfind("-----BEGIN CERTIFICATE-----", 0, end)
    if start < 0 or end < 0:
        raise TLSConfigError(f"SMQPS: no PEM certificate in {cert!r}")
    der = ssl.PEM_cert_to_DER_cert(pem[start:end + len("-----END CERTIFICATE-----")])
    return context, der


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
        # The event names of the server's protocol, spelled once per connection.
        protocol = server.protocol
        self._receive_type = f"{protocol}.receive"
        self._send_type = f"{protocol}.send"
        self._close_type = f"{protocol}.close"

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
            "type": self.server.protocol,
            "asgi": {"version": "3.0", "spec_version": "1.0"},
            "client": [peer[0], peer[1]],
            "server": [local[0], local[1]],
            "tls": self.server.tls,
        }
        self.server.connections.add(self)
        # Before anything the socket brings.
        self._deliver({"type": f"{self.server.protocol}.connect"})
        self._run = asyncio.ensure_future(self.run(self.server.application))

    def data_received(self, data: bytes) -> None:
        self._deliver({"type": self._receive_type, "bytes": data})
        if len(self.inbox) >= INBOX_SIZE and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        # The peer has finished sending (maybe only a half-close). The transport stays open:
        # replies to what it sent are still written, then the application's end closes it.
        self._peer_gone()
        # TLS has no half-close: its transport closes whatever this returns (and warns).
        return self.server.ssl_context is None

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
        self._deliver({"type": f"{self.server.protocol}.disconnect"})
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
        if kind == self._send_type:
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
        elif kind == self._close_type:
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
                logger.error("%s application failed", self.server.protocol.upper(),
                             exc_info=True)
        finally:
            self._close_transport()
            self.server.connections.discard(self)


class SMQPServer:
    """Serve ``application`` on ``host:port``; over TLS when ``tls_cert`` (and ``tls_key``,
    PEM files) are given. ``protocol`` names the scope type and the events."""

    def __init__(self, application: ASGIApp, host: str, port: int, *,
                 reuse_port: bool = False, backlog: int = 1024,
                 disconnect_timeout: float = 10.0,
                 tls_cert: str = "", tls_key: str = "", protocol: str = "smqp") -> None:
        self.application = application
        self.protocol = protocol
        self.tls_cert = tls_cert
        self.tls_key = tls_key or tls_cert
        self.ssl_context: ssl.SSLContext | None = None
        self.tls: dict | None = None  # the scope's "tls" entry
        if tls_cert:
            self.ssl_context, der = load_tls_certificate(self.tls_cert, self.tls_key)
            self.tls = {"server_cert": der}
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
            reuse_port=self.reuse_port or None, ssl=self.ssl_context,
        )
        return [s.getsockname()[:2] for s in self._server.sockets]

    def reload_tls(self) -> None:
        """Read the certificate and key files again (SIGHUP): new handshakes present the new
        certificate, established connections keep theirs. Both are checked in a context of
        their own first, so a bad pair raises :class:`TLSConfigError` and changes nothing."""
        if self.ssl_context is None:
            return
        _, der = load_tls_certificate(self.tls_cert, self.tls_key)
        # The listening socket keeps its context: the new pair is loaded into that one.
        self.ssl_context.load_cert_chain(self.tls_cert, self.tls_key)
        self.tls = {"server_cert": der}

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, tell every connection (``smqp.shutdown``), wait up to ``grace``
        seconds for them to leave, then close what remains."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.put_nowait({"type": f"{self.protocol}.shutdown", "grace": grace})
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
