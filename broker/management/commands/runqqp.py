"""``manage.py runqqp``: the QQP ingestion listener (plain TCP on ``SMQP_QQP_PORT``, and TLS on
``SMQP_QQP_TLS_PORT`` with the SMQP certificate when one is configured). Items are published
through this process's dispatcher (its group commit and storage processes)."""

from __future__ import annotations

import asyncio
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from .runsmqp import (
    PRIVILEGED_PORT_HELP,
    STORAGE_READY_SECONDS,
    _BindError,
    run_event_loop,
)
from .runsmqp import Command as SMQPCommand

#: How often the listener forgets ResourceIDs past their retention.
FORGET_EVERY_SECONDS = 3600


class Command(BaseCommand):
    help = "Run the QQP ingestion listener (TCP, and TLS when a certificate is configured)."
    # Checked once by runbroker (or `manage.py check`), not by each process it starts.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.SMQP_HOST)
        parser.add_argument("--port", type=int, default=settings.SMQP_QQP_PORT)
        parser.add_argument("--tls-port", type=int, default=settings.SMQP_QQP_TLS_PORT)
        parser.add_argument("--tls-cert", default=settings.SMQP_TLS_CERT)
        parser.add_argument("--tls-key", default=settings.SMQP_TLS_KEY)
        parser.add_argument("--grace", type=float, default=settings.SMQP_SHUTDOWN_GRACE)

    def handle(self, *args, host: str, port: int, tls_port: int, tls_cert: str, tls_key: str,
               grace: float, **options) -> None:
        from django.db import connection

        from broker.server import TLSConfigError, load_tls_certificate

        listeners = [(port, "", "")]
        if tls_cert:
            tls_key = tls_key or tls_cert
            try:
                load_tls_certificate(tls_cert, tls_key)
            except TLSConfigError as exc:
                raise CommandError(str(exc)) from exc
            listeners.append((tls_port, tls_cert, tls_key))
        connection.close()
        from broker.services.storage_calls import fork_storage_processes

        fork_storage_processes()
        try:
            run_event_loop(self._serve(host, listeners, grace))
        except _BindError as failed:
            exc, bad_port = failed.args
            if isinstance(exc, PermissionError):
                raise CommandError(PRIVILEGED_PORT_HELP.format(port=bad_port)
                                   .replace("runsmqp", "runqqp")
                                   .replace("SMQP_PORT", "SMQP_QQP_PORT")) from exc
            raise CommandError(
                f"Cannot listen on {host}:{bad_port}: {exc.strerror or exc}") from exc

    async def _serve(self, host: str, listeners: list[tuple[int, str, str]],
                     grace: float) -> None:
        from broker.delivery import get_dispatcher
        from broker.delivery import shutdown as shutdown_dispatchers
        from broker.server import SMQPServer
        from broker.store.lanes import StorageLost
        from broker.tcp_apps import qqp_application

        try:
            await asyncio.wait_for(get_dispatcher().storage.ready(), STORAGE_READY_SECONDS)
        except (TimeoutError, StorageLost):
            self.stderr.write("The storage processes are not ready; serving anyway")
        servers: list[SMQPServer] = []
        application = qqp_application()
        for port, cert, key in listeners:
            server = SMQPServer(application, host, port, tls_cert=cert, tls_key=key,
                                protocol="qqp")
            try:
                addresses = await server.start()
            except OSError as exc:
                for started in servers:
                    await started.shutdown(0)
                raise _BindError(exc, port) from exc
            servers.append(server)
            for bound_host, bound_port in addresses:
                name = "QQPS" if cert else "QQP"
                self.stdout.write(f"{name} listening on {bound_host}:{bound_port}")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP: the QQPS listener reads the certificate and key again, as runsmqp's does.
        loop.add_signal_handler(signal.SIGHUP, SMQPCommand._reload_tls, self, servers)
        forgetting = asyncio.ensure_future(self._forget_old())
        await stop.wait()
        forgetting.cancel()
        self.stdout.write(f"QQP shutting down ({grace:g} s grace)")
        sys.stdout.flush()
        await asyncio.gather(*(server.shutdown(grace) for server in servers))
        await shutdown_dispatchers(timeout=5.0)

    async def _forget_old(self) -> None:
        """ResourceIDs past ``SMQP_QQP_DEDUP_DAYS`` are removed, at start and then hourly."""
        from django.db import DatabaseError

        from broker.services import qqp_resources
        from broker.store import dbthread

        while True:
            try:
                await dbthread.run(qqp_resources.forget_old)
            except DatabaseError:
                self.stderr.write("QQP: old ResourceIDs not removed (the store is unavailable)")
            await asyncio.sleep(FORGET_EVERY_SECONDS)
