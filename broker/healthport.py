"""The SMQP listener's own health port (``runsmqp --health-port``, ``SMQP_HEALTH_PORT``): HTTP
``GET /healthz`` and ``GET /readyz`` for HAProxy's check of the SMQP backend, which a TCP
check cannot give: a listener whose database, Redis or storage processes are gone still
accepts connections and greets.

``/readyz`` answers 503 once the listener drains (SIGTERM: its sessions are told NOTIFY
SERVER BYE), so the balancer sends new sessions elsewhere during the grace period.

Written on asyncio streams: the check needs two routes and no framework, and it must run on
the listener's own loop (it asks the listener's storage processes, not another process's).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

logger = logging.getLogger("broker.health")

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}
#: Longest a client may take to send its request, and the largest request head read.
REQUEST_TIMEOUT = 5.0
MAX_HEAD = 8192


class HealthPort:
    def __init__(self, storage_health: Callable[[], list[dict]]) -> None:
        self.storage_health = storage_health
        self.draining = False
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD)
        return self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def readiness(self) -> dict[str, str]:
        from broker.store import dbthread, health

        if self.draining:  # nothing else matters now (and the database threads are stopping)
            return {"listener": "draining: shutting down"}
        checks = {"listener": "ok"}
        database, redis_problem = await asyncio.gather(
            dbthread.run(health.database_problem), asyncio.to_thread(health.redis_problem))
        checks["database"] = database or "ok"
        checks["redis"] = redis_problem or "ok"
        down = [lane["name"] for lane in self.storage_health() if not lane["alive"]]
        checks["storage"] = f"storage process down: {', '.join(down)}" if down else "ok"
        return checks

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await asyncio.wait_for(self._answer(reader), REQUEST_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            status, body = 400, {"error": "bad request"}
        except Exception:  # a failing check must not take the port down
            logger.exception("health check failed")
            status, body = 503, {"ready": False, "error": "check failed"}
        data = (json.dumps(body) + "\n").encode()
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nCache-Control: no-store\r\n"
                "Connection: close\r\n\r\n").encode()
        try:
            # A checker that gave up (HAProxy's check timeout on a busy node) reset its
            # connection: the answer has nowhere to go (uvloop raises on a closed transport).
            if not writer.transport.is_closing():
                writer.write(head + data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, dict]:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise ValueError("bad request line")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target not in ("/healthz", "/readyz"):
            return 404, {"error": "not found"}
        if method not in ("GET", "HEAD"):
            return 405, {"error": "GET only"}
        if target == "/healthz":
            return 200, {"live": True}
        checks = await self.readiness()
        ready = all(value == "ok" for value in checks.values())
        return (200 if ready else 503), {"ready": ready, "checks": checks}
