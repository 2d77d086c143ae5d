"""``manage.py runbroker``: the whole broker on one machine, in one command.

Starts Daphne (admin, HTTP, WebSocket), the SMQP listener, a Celery worker and Celery beat as
child processes, starts one that exits again (:class:`_Restarts`), and stops them all on
Ctrl-C or SIGTERM (or when one keeps exiting).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from .runsmqp import PRIVILEGED_PORT_HELP


def _endpoint_escape(value: str) -> str:
    """Twisted endpoint strings separate with ':' and '='; a backslash escapes them."""
    return value.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


def https_endpoint(host: str, port: int) -> str:
    """Daphne's TLS endpoint (Twisted ``ssl:``) with the SMQPS certificate and key. OpenSSL 3's
    default security level already refuses TLS 1.0/1.1, as SMQPS does. Daphne reads the files
    once: SIGHUP reloads SMQPS and QQPS only (see the README)."""
    return (f"ssl:port={port}:interface={_endpoint_escape(host)}"
            f":privateKey={_endpoint_escape(settings.SMQP_TLS_KEY)}"
            f":certKey={_endpoint_escape(settings.SMQP_TLS_CERT)}")


def _die_with_parent() -> None:
    """In each child, before exec: SIGTERM when runbroker dies, even by SIGKILL, so that no
    listener outlives it holding its port (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


# A child that exits is started again, as the systemd units restart each process
# (Restart=always, RestartSec=1): a Redis failover can end the Celery worker (kombu fails
# while it closes the lost connection), and that must not take the node's doors down with it.
# One that exits RESTART_BURST times within RESTART_WINDOW seconds stops the broker instead,
# as systemd's start limit fails a unit that keeps dying.
RESTART_DELAY = 1.0
RESTART_BURST = 5
RESTART_WINDOW = 60.0


class _Restarts:
    """When each exited child is to be started again, and how often each exited lately."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}
        self._exits: dict[str, list[float]] = {}

    def waiting(self, name: str) -> bool:
        return name in self._due

    def exited(self, name: str, now: float) -> bool:
        """``name`` exited at ``now``: True when it is to be started again (after
        RESTART_DELAY), False when it exited too often (the broker stops)."""
        recent = [t for t in self._exits.get(name, []) if now - t < RESTART_WINDOW] + [now]
        self._exits[name] = recent
        if len(recent) >= RESTART_BURST:
            return False
        self._due[name] = now + RESTART_DELAY
        return True

    def due(self, now: float) -> list[str]:
        """The children to start again now."""
        names = [name for name, when in self._due.items() if when <= now]
        for name in names:
            del self._due[name]
        return names


WILDCARDS = {"", "0.0.0.0", "::"}
# The doors the start-up line names after the admin's address, in that order, as it names them.
LISTED = {"SMQP": "SMQP", "SMQPS": "SMQPS", "QQP": "QQP", "HTTPS": "HTTPS and wss://"}


def _refuse_shared_ports(doors: list[tuple[str, str, int]]) -> None:
    """Two doors given one port would each pass the bind check alone; the second to start
    would then fail and be restarted until runbroker gives up. Refused before anything starts."""
    for i, (door, host, port) in enumerate(doors):
        for other, other_host, other_port in doors[i + 1:]:
            if port and port == other_port and (
                    host == other_host or {host, other_host} & WILDCARDS):
                raise CommandError(f"{door} and {other} are both given port {port}: "
                                   "give each door a port of its own.")


class Command(BaseCommand):
    help = ("Run Daphne, the SMQP listener, the QQP listener, a Celery worker and Celery beat "
            "together.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--http-host", default=os.environ.get("HTTP_HOST", "127.0.0.1"))
        parser.add_argument(
            "--http-port", type=int, default=int(os.environ.get("HTTP_PORT", "8000"))
        )
        parser.add_argument("--smqp-host", default=settings.SMQP_HOST)
        parser.add_argument("--smqp-port", type=int, default=settings.SMQP_PORT)
        parser.add_argument("--smqp-tls-port", type=int, default=settings.SMQP_TLS_PORT,
                            help="SMQPS port, served when SMQP_TLS_CERT is set.")
        parser.add_argument("--qqp-port", type=int, default=settings.SMQP_QQP_PORT,
                            help="QQP port (and QQPS on SMQP_QQP_TLS_PORT with SMQP_TLS_CERT).")
        parser.add_argument("--https-port", type=int, default=settings.SMQP_HTTPS_PORT,
                            help="HTTPS and wss:// port when SMQP_TLS_CERT is set (8443).")
        parser.add_argument("--no-celery", action="store_true", help="Start no Celery processes.")

    def handle(self, *args, **opts) -> None:
        doors = [(door, host, port) for door, host, port, served in (
            ("SMQP", opts["smqp_host"], opts["smqp_port"], settings.SMQP_PLAIN),
            ("SMQPS", opts["smqp_host"], opts["smqp_tls_port"], settings.SMQP_TLS),
            ("HTTP", opts["http_host"], opts["http_port"], True),
            ("HTTPS", opts["http_host"], opts["https_port"], settings.SMQP_TLS),
            ("QQP", opts["smqp_host"], opts["qqp_port"], True),
            ("QQPS", opts["smqp_host"], settings.SMQP_QQP_TLS_PORT, settings.SMQP_TLS),
        ) if served]
        _refuse_shared_ports(doors)
        for _door, host, port in doors:
            self._check_bind(host, port)
        python = sys.executable
        manage = [python, str(settings.BASE_DIR / "manage.py")]
        beat_schedule = str(settings.VAR_DIR / "celerybeat-schedule")
        children: dict[str, list[str]] = {
            "daphne": [
                python, "-m", "daphne", "-b", opts["http_host"], "-p", str(opts["http_port"]),
                *(["-e", https_endpoint(opts["http_host"], opts["https_port"])]
                  if settings.SMQP_TLS else []),
                "broker.asgi_server:application",
            ],
            "smqp": [
                *manage, "runsmqp", "--host", opts["smqp_host"], "--port", str(opts["smqp_port"]),
                "--tls-port", str(opts["smqp_tls_port"]),
            ],
            "qqp": [
                *manage, "runqqp", "--host", opts["smqp_host"], "--port", str(opts["qqp_port"]),
            ],
        }
        # Federation links (profile §9.5): one SMQP client session per enabled link.
        children["links"] = [*manage, "runlinks"]
        if not opts["no_celery"]:
            children["celery-worker"] = [
                python, "-m", "celery", "-A", "broker", "worker", "--loglevel", "INFO",
                "--concurrency", "2",
            ]
            # Beat runs on the one node of a cluster that holds its lease (runbeat).
            children["celery-beat"] = [*manage, "runbeat", "--schedule", beat_schedule]
        procs: dict[str, subprocess.Popen] = {}
        stopping = False
        failed = ""  # the child that kept exiting, when that is why the broker stops

        def request_stop(signum, frame) -> None:
            nonlocal stopping
            stopping = True

        def reload_certificate(signum, frame) -> None:
            # SIGHUP to the broker reaches the SMQP listener, which reads its TLS files again.
            for name in ("smqp", "qqp"):  # QQPS presents the same certificate
                child = procs.get(name)
                if child is not None and child.poll() is None:
                    child.send_signal(signal.SIGHUP)

        def start(name: str) -> None:
            # Own process group: the terminal's Ctrl-C reaches us, and we stop them in order.
            procs[name] = subprocess.Popen(children[name], cwd=settings.BASE_DIR,
                                           start_new_session=True, preexec_fn=_die_with_parent)
            self.stdout.write(f"started {name} (pid {procs[name].pid})")
            sys.stdout.flush()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGHUP, reload_certificate)
        try:
            for name in children:
                start(name)
            served = {door: f"{host}:{port}" for door, host, port in doors}
            listed = [f"{label} on {served[door]}" for door, label in LISTED.items()
                      if door in served]
            self.stdout.write(
                f"Broker running: admin at http://{opts['http_host']}:{opts['http_port']}/admin/,"
                f" {', '.join(listed)}. Ctrl-C stops."
            )
            if not settings.SMQP_TLS:
                self.stdout.write(
                    "TLS is off: set SMQP_TLS_CERT and SMQP_TLS_KEY (PEM files) to serve SMQPS "
                    f"on SMQP_TLS_PORT ({opts['smqp_tls_port']}), QQPS on SMQP_QQP_TLS_PORT "
                    f"({settings.SMQP_QQP_TLS_PORT}), and HTTPS/wss:// on SMQP_HTTPS_PORT "
                    f"({opts['https_port']}).")
            sys.stdout.flush()
            restarts = _Restarts()
            while not stopping:
                for name, proc in procs.items():
                    if proc.poll() is not None and not restarts.waiting(name):
                        if restarts.exited(name, time.monotonic()):
                            self.stderr.write(f"{name} exited with status {proc.returncode}; "
                                              f"starting it again in {RESTART_DELAY:.0f} s")
                        else:
                            failed = (f"{name} exited with status {proc.returncode}, "
                                      f"{RESTART_BURST} times in {RESTART_WINDOW:.0f} s")
                            self.stderr.write(f"{failed}: stopping")
                            stopping = True
                            break
                for name in restarts.due(time.monotonic()):
                    if not stopping:
                        start(name)
                time.sleep(0.2)
        finally:
            self._stop_all(procs)
        if failed:
            # Not a clean stop: a service manager restarts (or reports) a failed broker.
            raise CommandError(f"the broker stopped because {failed}")

    def _stop_all(self, procs: dict[str, subprocess.Popen]) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + settings.SMQP_SHUTDOWN_GRACE + 15
        for name, proc in procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop; killing it")
                proc.kill()
                proc.wait()
        self.stdout.write("Broker stopped.")

    def _check_bind(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except PermissionError as exc:
                raise CommandError(PRIVILEGED_PORT_HELP.format(port=port)) from exc
            except OSError as exc:
                raise CommandError(f"Cannot listen on {host}:{port}: {exc.strerror}") from exc
