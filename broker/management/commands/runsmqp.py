"""``manage.py runsmqp``: the SMQP listener alone (plain TCP, and SMQPS when a certificate is
configured). SIGHUP reads the TLS certificate and key again."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
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


logger = logging.getLogger("broker.server")

#: Longest the listener waits for its storage processes before it serves.
STORAGE_READY_SECONDS = 60


class Command(BaseCommand):
    help = "Run the SMQP listener (TCP). SIGTERM or Ctrl-C warns every session and stops."
    # Checked once by runbroker (or `manage.py check`), not by each process it starts.
    requires_system_checks: list[str] = []

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
        parser.add_argument("--tls-port", type=int, default=settings.SMQP_TLS_PORT,
                            help="SMQPS port (used when a certificate is configured).")
        parser.add_argument("--tls-cert", default=settings.SMQP_TLS_CERT,
                            help="PEM certificate (chain) for SMQPS; none: no TLS listener.")
        parser.add_argument("--tls-key", default=settings.SMQP_TLS_KEY,
                            help="PEM private key of --tls-cert (default: in the cert file).")
        parser.add_argument("--health-port", type=int, default=settings.SMQP_HEALTH_PORT,
                            help="HTTP /healthz and /readyz for a load balancer's check "
                                 "(0: a free port; default SMQP_HEALTH_PORT, none if unset).")
        parser.add_argument("--plain", action=argparse.BooleanOptionalAction,
                            default=settings.SMQP_PLAIN,
                            help="Serve plain TCP on --port too (default: SMQP_PLAIN).")

    def handle(self, *args, host: str, port: int, reuse_port: bool, grace: float,
               tls_port: int, tls_cert: str, tls_key: str, plain: bool,
               health_port: int | None, **options):
        from django.db import connection

        from broker.delivery import recover_journals
        from broker.server import TLSConfigError, load_tls_certificate

        tls_key = tls_key or tls_cert
        if not plain and not tls_cert:
            raise CommandError("--no-plain (SMQP_PLAIN=0) needs a TLS certificate "
                               "(--tls-cert or SMQP_TLS_CERT): no listener would be left")
        if tls_cert:
            try:  # a missing file or a mismatched key is said before anything starts
                load_tls_certificate(tls_cert, tls_key)
            except TLSConfigError as exc:
                raise CommandError(str(exc)) from exc
            if not os.environ.get("SMQP_CLEAR_ON_PLAIN"):
                # The certificate came from the command line: TLS is configured all the
                # same, so CLEAR on plain TCP takes the default that goes with it.
                settings.SMQP_CLEAR_ON_PLAIN = "loopback"
        listeners: list[tuple[int, str, str]] = []
        if plain:
            listeners.append((port, "", ""))
        if tls_cert:
            listeners.append((tls_port, tls_cert, tls_key))

        # ACKs a listener that is gone had journaled reach the database before any session
        # here reads a backlog (which would offer those messages again).
        recovered = recover_journals()
        if recovered:
            self.stdout.write(f"Recovered {recovered} ACK(s) from the journals of stopped "
                              f"listeners")
        connection.close()
        from broker.services.storage_calls import fork_storage_processes

        fork_storage_processes()
        try:
            run_event_loop(self._serve(host, listeners, reuse_port, grace, health_port))
        except _BindError as failed:
            exc, bad_port = failed.args
            if isinstance(exc, PermissionError):
                raise CommandError(PRIVILEGED_PORT_HELP.format(port=bad_port)) from exc
            raise CommandError(
                f"Cannot listen on {host}:{bad_port}: {exc.strerror or exc}") from exc
        except PermissionError as exc:
            raise CommandError(PRIVILEGED_PORT_HELP.format(port=listeners[0][0])) from exc
        except OSError as exc:
            raise CommandError(f"Cannot listen on {host}:{listeners[0][0]}: "
                               f"{exc.strerror or exc}") from exc

    async def _serve(self, host: str, listeners: list[tuple[int, str, str]],
                     reuse_port: bool, grace: float, health_port: int | None) -> None:
        from broker.delivery import get_dispatcher
        from broker.delivery import shutdown as shutdown_dispatchers
        from broker.store.lanes import StorageLost

        # The dispatcher first: it takes the storage processes forked before, or starts
        # them (they load Django, about a second) while this one loads the rest, and the
        # listener serves once they answer. The first publish after a start would otherwise
        # wait for them, and every publish behind it.
        storage = get_dispatcher().storage
        from broker.heap import freeze_startup
        from broker.server import SMQPServer
        from broker.tcp_apps import smqp_application

        try:
            await asyncio.wait_for(storage.ready(), STORAGE_READY_SECONDS)
        except (TimeoutError, StorageLost):
            # The first publish starts it again (a broken install says so in the log).
            self.stderr.write("The storage processes are not ready; serving anyway")
        servers: list[SMQPServer] = []
        bound: list[tuple[str, str, int]] = []
        application = smqp_application()
        for port, cert, key in listeners:
            server = SMQPServer(application, host, port, reuse_port=reuse_port,
                                tls_cert=cert, tls_key=key)
            try:
                addresses = await server.start()
            except OSError as exc:
                for started in servers:
                    await started.shutdown(0)
                raise _BindError(exc, port) from exc
            servers.append(server)
            bound += [("SMQPS" if cert else "SMQP", h, p) for h, p in addresses]
        health = None
        if health_port is not None:
            from broker.healthport import HealthPort

            health = HealthPort(storage.health)
            try:
                health_host, bound_health = await health.start(host, health_port)
            except OSError as exc:
                for started in servers:
                    await started.shutdown(0)
                raise _BindError(exc, health_port) from exc
        freeze_startup()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_tls, servers)
        kind = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
        for name, bound_host, bound_port in bound:
            self.stdout.write(f"{name} listening on {bound_host}:{bound_port} "
                              f"({kind} event loop)")
        if health is not None:
            self.stdout.write(f"Health checks on http://{health_host}:{bound_health}/readyz")
        sys.stdout.flush()
        await stop.wait()
        self.stdout.write(f"SMQP shutting down ({grace:g} s grace)")
        sys.stdout.flush()
        if health is not None:
            health.draining = True  # /readyz says 503: the balancer sends no new sessions
        await asyncio.gather(*(server.shutdown(grace) for server in servers))
        if health is not None:
            await health.close()
        await shutdown_dispatchers(timeout=5.0)

    def _reload_tls(self, servers: list) -> None:
        """SIGHUP: the TLS listener presents the certificate and key files as they are now;
        a pair that does not load is logged and the one in use is kept."""
        from broker.server import TLSConfigError

        for server in servers:
            if server.ssl_context is None:
                continue
            try:
                server.reload_tls()
            except (TLSConfigError, OSError, ValueError) as exc:
                logger.error("SIGHUP: TLS certificate not reloaded (%s); keeping the old one",
                             exc)
            else:
                logger.info("SIGHUP: TLS certificate reloaded from %s", server.tls_cert)


class _BindError(Exception):
    """A listener could not bind: (the OSError, the port)."""
