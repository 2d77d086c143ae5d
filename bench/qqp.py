"""The ``qqp`` benchmark: QQP items per second against SMQP publishes, in the same run.

It starts an isolated broker (``runsmqp``) and a ``runqqp`` beside it on the same database,
with the superuser ``root`` (unsigned QQP items from loopback are published as root) and the
topic ``/bench``. Then, for ``--seconds`` each, ``--senders`` threads (4) send one item at a
time with a ``--size``-byte payload (256) and wait for its status (QQP allows no pipelining),
and as many SMQP publishers send one ``PUB MESSAGE`` at a time and wait for its ``200``. Both
wait for the commit before the next item, so the figures compare the two doors' per-item
costs on the same group commit. No one subscribes to ``/bench``.
"""

from __future__ import annotations

import argparse
import functools
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

from broker.qqp.send import QQPSender

from .isolated import ROOT, BrokerEnv, BrokerSetupError, check_services, isolated_broker
from .stats import environment_info, timestamp, write_results

SETUP = (
    "from accounts.models import Account\n"
    "a = Account(username='root', is_superuser=True, is_staff=True)\n"
    "a.set_password('pw')\n"
    "a.save()\n"
)
FINAL_LINE = re.compile(rb"^\d{3} ", re.M)


def _start_qqp(broker: BrokerEnv) -> tuple[subprocess.Popen, int]:
    log_path = broker.var_dir / "runqqp.log"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runqqp", "--host", "127.0.0.1", "--port", "0"],
        env=broker.env, cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"QQP listening on [\d.]+:(\d+)", log_path.read_text(errors="replace"))
        if match:
            return proc, int(match[1])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise BrokerSetupError(f"runqqp did not start:\n{log_path.read_text(errors='replace')}")


class _SMQP:
    """A blocking SMQP publisher: one PUB MESSAGE at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        while b"\r\n" not in self.buffer:  # the greeting line
            self.buffer += self.sock.recv(4096)
        self.buffer = self.buffer.split(b"\r\n", 1)[1]
        self.command(b"LOGIN root CLEAR/1.0\r\n")
        assert self.command(b"PASS root pw\r\n").startswith(b"200"), "login failed"

    def reply(self) -> bytes:
        while True:
            match = FINAL_LINE.search(self.buffer)
            if match:
                end = self.buffer.find(b"\r\n", match.start())
                if end >= 0:
                    line, self.buffer = self.buffer[match.start():end], self.buffer[end + 2:]
                    return line
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the SMQP listener closed the connection")
            self.buffer += data

    def command(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        return self.reply()

    def publish(self, cmuid: str, body: bytes) -> bool:
        reply = self.command(
            b"PUB MESSAGE /bench %s\r\n\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s\r\n.\r\n" % (cmuid.encode(), len(body), body))
        return reply.startswith(b"200")


def _run(senders: int, seconds: float, send_one: Callable[[int], Callable[[int], bool]]
         ) -> tuple[int, int]:
    """(items answered ok, failures) of ``senders`` threads for ``seconds``."""
    counts = [0] * senders
    failures = [0] * senders
    start = threading.Barrier(senders + 1)
    stop_at = [0.0]

    def loop(index: int) -> None:
        send = send_one(index)
        start.wait()
        n = 0
        while time.monotonic() < stop_at[0]:
            if send(n):
                counts[index] += 1
            else:
                failures[index] += 1
            n += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(senders)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.monotonic() + seconds + 3600  # until the barrier is passed
    start.wait()
    stop_at[0] = time.monotonic() + seconds
    for thread in threads:
        thread.join(seconds + 60)
    return sum(counts), sum(failures)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="postgres")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="payload bytes per item")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate QQP and SMQP this many times each")


def main(args: argparse.Namespace) -> int:
    backends = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    check_services(backends)
    payload = b"x" * args.size
    runs = []
    for backend in backends:
        with isolated_broker(backend, setup=lambda b: b.run_python(SETUP),
                             extra_env={"SMQP_QQP_UNSIGNED_ACCOUNT": "root"}) as broker:
            setup = _SMQP(broker.host, broker.port)
            assert setup.command(b"CREATE TOPIC /bench\r\n").startswith(b"200")
            qqp_proc, qqp_port = _start_qqp(broker)
            try:
                def qqp_sender(index: int, run_id: str, port: int = qqp_port
                               ) -> Callable[[int], bool]:
                    sender = QQPSender(broker.host, port)

                    def send(n: int) -> bool:
                        code, _ = sender.send({"Action": b"smqp:/bench",
                                               "ResourceID": f"{run_id}-{index}-{n}".encode(),
                                               "Payload": payload})
                        return code == 2
                    return send

                def smqp_sender(index: int, run_id: str) -> Callable[[int], bool]:
                    client = _SMQP(broker.host, broker.port)
                    return lambda n: client.publish(f"{run_id}-{index}-{n}", payload)

                for round_ in range(args.rounds):
                    for door, make in (("qqp", qqp_sender), ("smqp", smqp_sender)):
                        run_id = uuid.uuid4().hex[:6]
                        ok, failed = _run(args.senders, args.seconds,
                                          functools.partial(make, run_id=run_id))
                        rate = ok / args.seconds
                        runs.append({"backend": backend, "door": door, "round": round_,
                                     "senders": args.senders, "payload": args.size,
                                     "items": ok, "failed": failed, "per_second": rate})
                        print(f"{backend:8} {door:5} round {round_}: {rate:8.1f} items/s "
                              f"({ok} in {args.seconds:g} s, {failed} failed)")
                        sys.stdout.flush()
            finally:
                qqp_proc.terminate()
                qqp_proc.wait(30)
    record = {"benchmark": "qqp", "when": timestamp(), "environment": environment_info(),
              "runs": runs}
    path = write_results("qqp", record)
    print(f"results: {path}")
    return 0 if all(run["failed"] == 0 for run in runs) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(argparse.ArgumentParser().parse_args()))
