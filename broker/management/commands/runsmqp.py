"""``manage.py runsmqp``: the SMQP listener alone."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

PRIVILEGED_PORT_HELP = (
    "Binding port {port} is not permitted for this user (ports below 1024 need root or "
    "CAP_NET_BIND_SERVICE). Choose another port: `manage.py runsmqp --port 7200`, "
    "or set SMQP_PORT=7200."
)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` to completion on the event loop ``SMQP_EVENT_LOOP`` names."""
    if settings.SMQP_EVENT_LOOP == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


#: Longest the listener waits for its storage processes before it serves.
STORAGE_READY_SECONDS = 60


class Command(BaseCommand):
    help = "Run the SMQP listener (TCP). SIGTERM or Ctrl-C warns every session and stops."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.SMQP_HOST)
        parser.add_argument("--port", type=int, default=settings.SMQP_PORT)
        parser.add_argument(
            "--reuse-port",
            action="store_true",
            help="Set SO_REUSEPORT so several listener processes can share one port.",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=settings.SMQP_SHUTDOWN_GRACE,
            help="Seconds between NOTIFY SERVER BYE and closing on shutdown.",
        )

    def handle(self, *args, host: str, port: int, reuse_port: bool, grace: float, **options):
        from django.db import connection

        from broker.delivery import recover_journals

        # ACKs a listener that is gone had journaled reach the database before any session
        # here reads a backlog (which would offer those messages again).
        recovered = recover_journals()
        if recovered:
            self.stdout.write(f"Recovered {recovered} ACK(s) from the journals of stopped "
                              f"listeners")
        connection.close()
        try:
            run_event_loop(self._serve(host, port, reuse_port, grace))
        except PermissionError as exc:
            raise CommandError(PRIVILEGED_PORT_HELP.format(port=port)) from exc
        except OSError as exc:
            raise CommandError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}") from exc

    async def _serve(self, host: str, port: int, reuse_port: bool, grace: float) -> None:
        from broker.delivery import get_dispatcher
        from broker.delivery import shutdown as shutdown_dispatchers
        from broker.store.lanes import StorageLost

        # The dispatcher first: its storage processes load Django (about a second) while
        # this one loads the rest, and the listener serves once they do. The first publish
        # after a start would otherwise wait for them, and every publish behind it.
        storage = get_dispatcher().storage
        from broker.asgi import application
        from broker.heap import freeze_startup
        from broker.server import SMQPServer

        try:
            await asyncio.wait_for(storage.ready(), STORAGE_READY_SECONDS)
        except (TimeoutError, StorageLost):
            # The first publish starts it again (a broken install says so in the log).
            self.stderr.write("The storage processes are not ready; serving anyway")
        server = SMQPServer(application, host, port, reuse_port=reuse_port)
        addresses = await server.start()
        freeze_startup()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        kind = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
        for bound_host, bound_port in addresses:
            self.stdout.write(f"SMQP listening on {bound_host}:{bound_port} ({kind} event loop)")
        sys.stdout.flush()
        await stop.wait()
        self.stdout.write(f"SMQP shutting down ({grace:g} s grace)")
        sys.stdout.flush()
        await server.shutdown(grace)
        await shutdown_dispatchers(timeout=5.0)
