"""``/healthz`` and ``/readyz`` over real HTTP: Daphne's (database, Redis) and the SMQP
listener's own health port (database, Redis, its storage processes, draining on SIGTERM),
what HAProxy checks before it sends a node clients (deploy/haproxy.cfg)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import accounts_script, daphne, fresh_database, listener, run_manage
from tests.support.smqp_session import Session
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=scaled(15)) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_daphne_probes_answer_ready_then_name_redis_when_it_is_gone(backend, tmp_path):
    with fresh_database(backend, tmp_path) as env:
        with daphne(env, tmp_path) as url:
            assert get(f"{url}/healthz") == (200, "ok\n")
            status, body = get(f"{url}/readyz")
            assert (status, json.loads(body)) == (
                200, {"ready": True, "checks": {"database": "ok", "redis": "ok"}})
        no_redis = {**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
        with daphne(no_redis, tmp_path, "daphne-no-redis.log") as url:
            assert get(f"{url}/healthz") == (200, "ok\n")  # alive all the same
            status, body = get(f"{url}/readyz")
            checks = json.loads(body)["checks"]
            assert status == 503 and checks["database"] == "ok"
            assert "ConnectionError" in checks["redis"]


def test_daphne_readyz_names_a_database_it_cannot_open(tmp_path):
    with fresh_database("sqlite", tmp_path) as env:
        gone = {**env, "DATABASE_URL": f"sqlite:///{tmp_path / 'missing-dir' / 'db.sqlite3'}"}
        with daphne(gone, tmp_path, "daphne-no-db.log") as url:
            status, body = get(f"{url}/readyz")
            checks = json.loads(body)["checks"]
            assert status == 503 and checks["redis"] == "ok"
            assert "OperationalError" in checks["database"]


def health_port_of(broker) -> str:
    """The listener's health address, once its log names it."""
    deadline = time.monotonic() + scaled(30)
    while "Health checks on" not in broker.log():
        assert time.monotonic() < deadline, broker.log()
        time.sleep(0.05)
    return health_url(broker.log())


def health_url(log: str) -> str:
    return re.search(r"Health checks on (http://[\d.]+:\d+)/readyz", log)[1]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def wait_for_status(url: str, status: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + scaled(timeout)
    while True:
        got, body = get(url)
        if got == status:
            return json.loads(body)
        assert time.monotonic() < deadline, f"{url}: {got} {body}, not {status}"
        time.sleep(0.1)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_listener_health_port_checks_storage_processes_and_drains(backend, tmp_path):
    with fresh_database(backend, tmp_path) as env:
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("bob"))
        # A storage process that ended is started again after this long: a window wide
        # enough for the 503 between to be seen on a loaded machine.
        env = {**env, "SMQP_STORAGE_RESTART_SECONDS": str(scaled(5))}
        with listener(env, tmp_path, "--health-port", "0", "--grace", "4") as broker:
            deadline = time.monotonic() + scaled(30)
            while "Health checks on" not in broker.log():
                assert time.monotonic() < deadline, broker.log()
                time.sleep(0.05)
            url = health_url(broker.log())
            assert get(f"{url}/healthz") == (200, '{"live": true}\n')
            ready = wait_for_status(f"{url}/readyz", 200)
            assert ready == {"ready": True, "checks": {
                "listener": "ok", "database": "ok", "redis": "ok", "storage": "ok"}}
            # A storage process killed: not ready until the listener has started it again,
            # which it does on its own: a load balancer sends a listener that is not ready
            # no session, so no group commit would come to start it.
            lanes = children(broker.proc.pid)
            assert lanes, "the listener runs its group commits in storage processes"
            os.kill(lanes[0], signal.SIGKILL)
            down = wait_for_status(f"{url}/readyz", 503, 30)
            assert down["checks"]["storage"].startswith("storage process down")
            wait_for_status(f"{url}/readyz", 200, 60)
            again = children(broker.proc.pid)
            assert lanes[0] not in again and len(again) == len(lanes), (lanes, again)
            assert "ended; starting it again" in broker.log()
            with Session(broker.host, broker.port, "bob") as bob:
                for i in range(3):
                    bob.publish("/accounts/bob", f"m{i}")
            assert wait_for_status(f"{url}/readyz", 200)["ready"]
            # Wrong method, unknown path, garbage: answered, and the port stays up.
            request = urllib.request.Request(f"{url}/readyz", method="POST", data=b"")
            try:
                urllib.request.urlopen(request, timeout=scaled(10))
            except urllib.error.HTTPError as exc:
                assert exc.code == 405
            assert get(f"{url}/metrics")[0] == 404
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=scaled(10)) as raw:
                raw.sendall(b"\x00garbage\r\n\r\n")
                assert raw.recv(100).startswith(b"HTTP/1.1 400")
            # SIGTERM: sessions get NOTIFY SERVER BYE, and during the grace period (a
            # session is still there) the check says 503: no new sessions are sent here.
            with Session(broker.host, broker.port, "bob"):
                broker.proc.send_signal(signal.SIGTERM)
                draining = wait_for_status(f"{url}/readyz", 503, 10)
            assert draining == {"ready": False,
                                "checks": {"listener": "draining: shutting down"}}
            broker.proc.wait(timeout=scaled(30))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_listener_readyz_names_redis_when_it_is_gone(backend, tmp_path):
    """The listener's /readyz with a Redis of its own, stopped and started again: 503 naming
    Redis while it is away (database and storage still ok), ready again once it is back."""
    port = closed_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path)]

    def start_redis() -> subprocess.Popen:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + scaled(30)
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return proc
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    redis_proc = start_redis()
    try:
        own_redis = {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        with fresh_database(backend, tmp_path, own_redis) as env, \
                listener(env, tmp_path, "--health-port", "0") as broker:
            url = health_port_of(broker)
            assert wait_for_status(f"{url}/readyz", 200)["checks"]["redis"] == "ok"
            # A checker that gives up before its answer (HAProxy's check timeout on a busy
            # node): its connection reset, the answer has nowhere to go, quietly.
            host, port_text = url.removeprefix("http://").rsplit(":", 1)
            for _ in range(20):
                with socket.create_connection((host, int(port_text))) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert get(f"{url}/readyz")[0] == 200
            assert "Unhandled exception" not in broker.log(), broker.log()[-3000:]
            redis_proc.terminate()
            redis_proc.wait(timeout=scaled(30))
            down = wait_for_status(f"{url}/readyz", 503, 60)["checks"]
            assert "ConnectionError" in down["redis"], down
            assert down["database"] == "ok" and down["storage"] == "ok", down
            assert get(f"{url}/healthz")[0] == 200  # alive all the same
            redis_proc = start_redis()
            wait_for_status(f"{url}/readyz", 200, 60)
    finally:
        redis_proc.terminate()
        redis_proc.wait(timeout=scaled(30))
