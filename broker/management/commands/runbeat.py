"""``manage.py runbeat``: Celery beat on exactly one node of a cluster. Every node runs this
(``runbroker`` does); the one holding the ``celery-beat`` lease (broker/store/leases.py) runs
``celery beat`` as its child, the others wait to take the lease over when it lapses. On one
machine it simply runs beat.

The child is stopped before the lease could pass to another node (the lease's own fence),
and dies with this process (PR_SET_PDEATHSIG) if this one is killed.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

LEASE = "celery-beat"


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: beat must not outlive its lease keeper


class Command(BaseCommand):
    help = "Run Celery beat on the one node holding the cluster's beat lease."
    # Checked once by runbroker (or `manage.py check`), not by each process it starts.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--schedule", default=str(settings.VAR_DIR / "celerybeat-schedule"))

    def handle(self, *args, schedule: str, **options) -> None:
        from broker.store.leases import Lease

        lease = Lease(settings.SMQP_LEASE_SECONDS)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        argv = [sys.executable, "-m", "celery", "-A", "broker", "beat", "--loglevel", "INFO",
                "--schedule", schedule]
        child: subprocess.Popen | None = None

        def fence() -> None:
            # A renewal stuck on an unreachable database must not keep beat running past
            # the lease's deadline: this checks the deadline on its own.
            while not stop.wait(0.5):
                running = child
                if running is not None and running.poll() is None and not lease.held(LEASE):
                    self.stderr.write("Beat lease lapsed unrenewed: killing celery beat")
                    running.kill()

        threading.Thread(target=fence, daemon=True, name="beat-fence").start()
        self.stdout.write(f"Beat lease keeper {lease.holder} running")
        sys.stdout.flush()
        try:
            while not stop.is_set():
                held = LEASE in lease.renew([LEASE])
                if held and (child is None or child.poll() is not None):
                    if child is not None:
                        self.stderr.write(f"celery beat exited ({child.returncode}); again")
                    child = subprocess.Popen(argv, cwd=settings.BASE_DIR,
                                             preexec_fn=_die_with_parent)
                    self.stdout.write(f"Holding the beat lease: celery beat started "
                                      f"(pid {child.pid})")
                    sys.stdout.flush()
                elif not held and child is not None:
                    self.stdout.write("Beat lease lost: stopping celery beat")
                    sys.stdout.flush()
                    self._stop(child)
                    child = None
                stop.wait(lease.ttl / 3)
        finally:
            if child is not None:
                self._stop(child)
            lease.release()

    def _stop(self, child: subprocess.Popen) -> None:
        child.terminate()
        try:
            child.wait(timeout=3)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
