"""``manage.py runbroker`` brings up the whole system, starts a child that died again, and
stops all of it on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import (
    ROOT,
    base_env,
    free_ports,
)
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_runbroker_serves_admin_and_smqp_and_stops_cleanly(database_urls, tmp_path):
    env = base_env(tmp_path, database_urls["sqlite"])
    http_port, smqp_port, qqp_port = free_ports(3)
    log_path = tmp_path / "runbroker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runbroker", "--http-port", str(http_port),
             "--smqp-port", str(smqp_port), "--qqp-port", str(qqp_port)],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        page = wait_for(
            lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{http_port}/admin/login/", timeout=2).read(),
            60, "the admin login page",
        )
        assert b"SMQP broker" in page and b"csrfmiddlewaretoken" in page
        css = urllib.request.urlopen(
            f"http://127.0.0.1:{http_port}/static/admin/css/base.css", timeout=scaled(5))
        assert css.status == 200
        wait_for(lambda: socket.create_connection(("127.0.0.1", smqp_port), timeout=1), 60,
                 "the SMQP port")
        with RawClient("127.0.0.1", smqp_port) as c:
            c.login("bob", "pw")
            assert c.command("NOOP") == [b"200 OK\r\n"]
        wait_for(lambda: "ready" in log_path.read_text() and "beat: Starting" in
                 log_path.read_text(), 60, "the Celery worker and beat")
        # A child that dies (the Celery worker, as a Redis failover can end it) is started
        # again; the doors stay up meanwhile.
        worker = int(re.search(r"started celery-worker \(pid (\d+)\)",
                               log_path.read_text())[1])
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: len(re.findall(r"started celery-worker \(pid (\d+)\)",
                                        log_path.read_text())) == 2, 30,
                 "the Celery worker to be started again")
        assert "celery-worker exited with status -9; starting it again" in log_path.read_text()
        with RawClient("127.0.0.1", smqp_port) as c:
            c.login("bob", "pw")
            assert c.command("NOOP") == [b"200 OK\r\n"]
        wait_for(lambda: len(re.findall(r"celery@\S+ ready\.", log_path.read_text())) >= 2,
                 60, "the new Celery worker to be ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=scaled(60)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text()
    assert "Broker stopped." in text
    assert "did not stop" not in text
    # Every child is gone: nothing listens any more.
    for port in (http_port, smqp_port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1)


def _runbroker_until_it_exits(env: dict[str, str], *args: object,
                              timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runbroker", *map(str, args)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=scaled(timeout))


def test_runbroker_refuses_a_port_in_use(database_urls, tmp_path):
    env = base_env(tmp_path, database_urls["sqlite"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        http_port, qqp_port = free_ports(2)
        result = _runbroker_until_it_exits(env, "--smqp-port", port, "--http-port", http_port,
                                           "--qqp-port", qqp_port)
    assert result.returncode != 0
    assert f"Cannot listen on 127.0.0.1:{port}" in result.stderr


def test_runbroker_refuses_one_port_for_two_doors(database_urls, tmp_path):
    """Each door's port is free alone, but HTTP and QQP are given the same one: refused
    before any child starts, naming both doors (not Daphne restarted on "Address already in
    use" until runbroker gives up)."""
    env = base_env(tmp_path, database_urls["sqlite"])
    smqp_port, shared = free_ports(2)
    result = _runbroker_until_it_exits(env, "--smqp-port", smqp_port, "--http-port", shared,
                                       "--qqp-port", shared)
    assert result.returncode != 0
    assert f"HTTP and QQP are both given port {shared}" in result.stderr, result.stderr
    assert "started" not in result.stdout, result.stdout


def test_runbroker_exits_with_an_error_when_a_child_keeps_failing(database_urls, tmp_path):
    """A certificate that cannot be loaded: every TLS door's child exits at start, is started
    again, and after its fifth exit within the window runbroker stops every child and exits
    non-zero, as a service manager must see a failed broker (it exited 0)."""
    (tmp_path / "broken.pem").write_text("not a certificate\n")
    names = ("--http-port", "--https-port", "--smqp-port", "--smqp-tls-port", "--qqp-port")
    *door_ports, qqps_port = ports = free_ports(len(names) + 1)
    env = {**base_env(tmp_path, database_urls["sqlite"]),
           "SMQP_TLS_CERT": str(tmp_path / "broken.pem"),
           "SMQP_TLS_KEY": str(tmp_path / "broken.pem"), "SMQP_QQP_TLS_PORT": str(qqps_port)}
    args = [value for pair in zip(names, door_ports, strict=True) for value in pair]
    result = _runbroker_until_it_exits(env, "--no-celery", *args, timeout=120)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert re.search(r"the broker stopped because \S+ exited with status 1, 5 times in 60 s",
                     result.stderr), result.stderr
    assert result.stdout.rstrip().endswith("Broker stopped."), result.stdout
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1)


def _start_in_terminal_group(env, tmp_path, *args):
    """runbroker as a shell starts it: the leader of the terminal's foreground process group,
    which the terminal's Ctrl-C (SIGINT) reaches as a whole."""
    log_path = tmp_path / "runbroker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runbroker", *args],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log_path


@pytest.mark.parametrize("when", ["starting", "running"])
def test_ctrl_c_stops_every_child_cleanly(database_urls, tmp_path, when):
    """Issue 36 item 11: Ctrl-C (SIGINT to the process group), while the children are still
    starting or once all run, stops them all: no traceback, none killed, and the start-up
    hints name the ports configured (here through the environment), not the defaults."""
    names = ("HTTP_PORT", "SMQP_PORT", "SMQP_QQP_PORT", "SMQP_TLS_PORT", "SMQP_HTTPS_PORT",
             "SMQP_QQP_TLS_PORT")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    env = {**base_env(tmp_path, database_urls["sqlite"]),
           **{k: str(v) for k, v in ports.items()}}
    proc, log_path = _start_in_terminal_group(env, tmp_path)
    try:
        wait_for(lambda: "Broker running" in log_path.read_text(), 90, "the start-up line")
        if when == "running":
            wait_for(lambda: "ready" in log_path.read_text() and "beat: Starting" in
                     log_path.read_text(), 90, "the Celery worker and beat")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=scaled(90)) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert "Broker stopped." in text
    assert "Traceback" not in text and "did not stop" not in text, text[-4000:]
    hints = text[text.index("Broker running"):].splitlines()[:2]
    assert f":{ports['HTTP_PORT']}/admin/" in hints[0] and f":{ports['SMQP_PORT']}" in hints[0]
    assert f":{ports['SMQP_QQP_PORT']}" in hints[0]
    for name in ("SMQP_TLS_PORT", "SMQP_HTTPS_PORT", "SMQP_QQP_TLS_PORT"):
        assert f"{name} ({ports[name]})" in hints[1], hints
