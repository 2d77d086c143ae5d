"""``manage.py runlinks``: the federation link supervisor alone (profile §9.5); ``runbroker``
starts it with the rest. SIGTERM or Ctrl-C says QUIT on every link and stops."""

from __future__ import annotations

import asyncio
import signal
import sys

from django.core.management.base import BaseCommand

from .runsmqp import run_event_loop


class Command(BaseCommand):
    help = "Run the federation links: one SMQP client session per enabled link."
    # Checked once by runbroker (or `manage.py check`), not by each process it starts.
    requires_system_checks: list[str] = []

    def handle(self, *args, **options) -> None:
        from django.db import connection

        connection.close()  # the database thread opens its own
        run_event_loop(self._run())

    async def _run(self) -> None:
        from broker.federation.supervisor import Supervisor

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.stdout.write("Link supervisor running")
        sys.stdout.flush()
        await Supervisor().run(stop)
        self.stdout.write("Link supervisor stopped")
