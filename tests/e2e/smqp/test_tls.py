"""SMQPS (profile §9.4) through real TLS sockets: a ``runsmqp`` with a certificate made by
``trustme`` at test time, its plain listener beside it, and the CLEAR-on-plain rule.

The non-loopback client of the CLEAR rule is a real one: a network namespace joined to this
one by a veth pair (skipped where namespaces cannot be made). The rule itself is decided by
:func:`broker.services.auth.clear_allowed` from the peer address the listener saw; that
function is also tested on its own for the addresses no test host can have.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme

from tests.conftest import (
    ROOT,
    accounts_script,
    free_ports,
    fresh_database,
    run_manage,
    stop_process,
)
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled


class TLSClient(RawClient):
    """:class:`RawClient` over TLS, verifying the server against ``context``."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext,
                 server_hostname: str = "localhost", timeout: float = 10.0) -> None:
        raw = socket.create_connection((host, port), timeout=scaled(timeout))
        try:
            self.sock = context.wrap_socket(raw, server_hostname=server_hostname)
        except BaseException:
            raw.close()
            raise
        self.buf = b""


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def write_pair(ca: trustme.CA, directory: Path, name: str) -> tuple[Path, Path]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    return cert_path, key_path


class Listener:
    def __init__(self, proc: subprocess.Popen, log_path: Path, ports: dict[str, int]) -> None:
        self.proc, self.log_path, self.ports = proc, log_path, ports

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def launch(env: dict[str, str], var_dir: Path, *args: str,
           expect: tuple[str, ...] = ("SMQP", "SMQPS")) -> subprocess.Popen | Listener:
    """Start ``runsmqp`` and wait for the listeners ``expect`` names; returns the finished
    process when it exits first (a refused configuration)."""
    log_path = var_dir / f"tls-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runsmqp", *args],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        found = dict(re.findall(r"^(SMQPS?) listening on [\d.]+:(\d+)", log_path.read_text(),
                                re.M))
        if all(name in found for name in expect):
            return Listener(proc, log_path, {k: int(v) for k, v in found.items()})
        if proc.poll() is not None:
            proc.log_text = log_path.read_text()  # type: ignore[attr-defined]
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"runsmqp did not start:\n{log_path.read_text()}")


def stop(listener: Listener) -> None:
    stop_process(listener.proc)


@contextmanager
def running(env: dict[str, str], var_dir: Path, *args: str,
            expect: tuple[str, ...] = ("SMQP", "SMQPS")) -> Iterator[Listener]:
    started = launch(env, var_dir, *args, expect=expect)
    assert isinstance(started, Listener), started.log_text  # type: ignore[union-attr]
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_env(tmp_path_factory, ca) -> Iterator[tuple[dict[str, str], Path]]:
    """A migrated SQLite database with ``bob`` (password ``pw``) and a certificate for
    localhost/127.0.0.1 in SMQP_TLS_CERT/SMQP_TLS_KEY."""
    base = tmp_path_factory.mktemp("tls")
    cert, key = write_pair(ca, base, "server")
    with fresh_database("sqlite", base,
                        {"SMQP_TLS_CERT": str(cert), "SMQP_TLS_KEY": str(key)}) as env:
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("bob"))
        yield env, base


@pytest.fixture(scope="module")
def tls_broker(tls_env) -> Iterator[Listener]:
    env, base = tls_env
    with running(env, base, "--host", "127.0.0.1", "--port", "0", "--tls-port", "0") as b:
        yield b


def clear_login(client: RawClient, user: str = "bob", password: str = "pw") -> list[bytes]:
    assert client.read_line().startswith(b"SMQP/")
    assert client.command(f"LOGIN {user} CLEAR/1.0") == [b"200 OK\r\n"]
    return client.command(f"PASS {user} {password}")


# --- SMQPS ------------------------------------------------------------------------------------


def test_clear_login_over_smqps(tls_broker, ca) -> None:
    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        assert client.sock.version() in ("TLSv1.2", "TLSv1.3")
        reply = clear_login(client)
        assert reply[-1].startswith(b"200 Guid: bob"), reply
        assert client.command("NOOP") == [b"200 OK\r\n"]


def test_client_pinning_another_ca_is_refused(tls_broker) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(trustme.CA()))


def test_tls_1_1_is_refused(tls_broker, ca) -> None:
    context = client_context(ca)
    # A client that would do TLS 1.1 (its own OpenSSL's security level lowered so that it
    # does not refuse first): the server refuses it (an alert, or uvloop just closes).
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError, match=r"ALERT_PROTOCOL_VERSION|UNEXPECTED_EOF"):
        TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], context)


def test_server_refuses_tls_1_1_at_its_end(tls_env) -> None:
    """The server's own context: nothing below TLS 1.2 is negotiated, whatever the client."""
    from broker.server import load_tls_certificate

    env, _ = tls_env
    context, der = load_tls_certificate(env["SMQP_TLS_CERT"], env["SMQP_TLS_KEY"])
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert der.startswith(b"\x30")  # a DER SEQUENCE


def test_plain_listener_serves_beside_tls_and_allows_clear_from_loopback(tls_broker) -> None:
    with RawClient("127.0.0.1", tls_broker.ports["SMQP"]) as client:
        assert clear_login(client)[-1].startswith(b"200 Guid: bob")


def test_plain_client_on_tls_port_gets_no_session(tls_broker) -> None:
    with RawClient("127.0.0.1", tls_broker.ports["SMQPS"], timeout=5) as client:
        client.send_line("LOGIN bob CLEAR/1.0")
        with pytest.raises((ConnectionError, TimeoutError, OSError)):
            line = client.read_line()
            if not line.startswith(b"SMQP/"):
                raise ConnectionError("no SMQP greeting on the TLS port")


# --- CLEAR on plain TCP -----------------------------------------------------------------------


def test_clear_on_plain_refused_when_configured_no(tls_env) -> None:
    env, base = tls_env
    with running({**env, "SMQP_CLEAR_ON_PLAIN": "no"}, base, "--host", "127.0.0.1",
                 "--port", "0", "--tls-port", "0") as broker, \
            RawClient("127.0.0.1", broker.ports["SMQP"]) as client:
        assert client.read_line().startswith(b"SMQP/")
        reply = client.command("LOGIN bob CLEAR/1.0")
        assert reply[-1].startswith(b"405 "), reply
        assert client.command("PASS bob pw")[-1].startswith(b"400 ")
        # SCRAM sends no password: it stays open on plain TCP.
        assert client.command("LOGIN bob SCRAM-SHA-256/1.0")[-1] == b"200 + \r\n"


@pytest.mark.parametrize(("tls", "policy", "peer", "allowed"), [
    (True, "no", "192.0.2.7", True),
    (False, "yes", "192.0.2.7", True),
    (False, "no", "127.0.0.1", False),
    (False, "loopback", "127.0.0.1", True),
    (False, "loopback", "127.0.0.2", True),  # all of 127.0.0.0/8 is this machine
    (False, "loopback", "::1", True),
    (False, "loopback", "::ffff:127.0.0.1", True),
    (False, "loopback", "192.0.2.7", False),
    (False, "loopback", "::ffff:192.0.2.7", False),
    (False, "loopback", "2001:db8::1", False),
    (False, "loopback", "", False),
])
def test_clear_allowed_rule(settings, tls, policy, peer, allowed) -> None:
    from broker.services.auth import clear_allowed

    settings.SMQP_CLEAR_ON_PLAIN = policy
    assert clear_allowed(tls, peer) is allowed


@contextmanager
def network_namespace() -> Iterator[tuple[str, str, str]]:
    """A namespace joined to this one by a veth pair: (namespace, this side's address, the
    namespace side's address), in the benchmarking range 198.18.0.0/15."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    ns, here, there = f"smqpns{tag}", f"sq{tag}a", f"sq{tag}b"
    block = random.randrange(1 << 14) * 4
    host_ip = f"198.{18 + (block >> 16)}.{(block >> 8) & 255}.{(block & 255) + 1}"
    peer_ip = f"198.{18 + (block >> 16)}.{(block >> 8) & 255}.{(block & 255) + 2}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{host_ip}/30", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{peer_ip}/30", "dev", there],
        ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
    ]
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"cannot make a network namespace: {result.stderr.strip()}")
        yield ns, host_ip, peer_ip
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


_NS_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
f = s.makefile("rb")
greeting = f.readline()
for line in sys.argv[3:]:
    s.sendall(line.encode() + b"\\r\\n")
    print(f.readline().decode().strip(), flush=True)
"""


def test_clear_on_plain_from_another_host_is_refused(tls_env) -> None:
    """A client in another network namespace (a real non-loopback peer): CLEAR is refused on
    plain TCP by default once TLS is configured; SCRAM is not."""
    env, base = tls_env
    with network_namespace() as (ns, host_ip, _peer_ip), running(
            env, base, "--host", host_ip, "--port", "0", "--tls-port", "0") as broker:
        result = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _NS_CLIENT, host_ip,
             str(broker.ports["SMQP"]), "LOGIN bob CLEAR/1.0", "LOGIN bob SCRAM-SHA-256/1.0"],
            capture_output=True, text=True, timeout=scaled(60),
        )
        assert result.returncode == 0, result.stderr
        clear, scram = result.stdout.splitlines()
        assert clear.startswith("405 "), clear
        assert scram.startswith("200"), scram


# --- start-up errors, SIGHUP reload, SMQP_PLAIN=0 ---------------------------------------------


def test_missing_key_is_a_clear_startup_error(tls_env) -> None:
    env, base = tls_env
    missing = str(base / "no-such.key")
    proc = launch({**env, "SMQP_TLS_KEY": missing}, base, "--port", "0", "--tls-port", "0")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=scaled(30)) != 0
    assert "cannot read the TLS key" in proc.log_text and missing in proc.log_text


def test_mismatched_key_is_a_clear_startup_error(tls_env, ca) -> None:
    env, base = tls_env
    _, other_key = write_pair(ca, base, "other")
    proc = launch({**env, "SMQP_TLS_KEY": str(other_key)}, base, "--port", "0",
                  "--tls-port", "0")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=scaled(30)) != 0
    assert "does not match the certificate" in proc.log_text, proc.log_text


def test_no_plain_needs_a_certificate(tls_env) -> None:
    env, base = tls_env
    no_tls = {k: v for k, v in env.items() if not k.startswith("SMQP_TLS_")}
    proc = launch({**no_tls, "SMQP_PLAIN": "0"}, base, "--port", "0")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=scaled(30)) != 0
    assert "needs a TLS certificate" in proc.log_text


def test_tls_only(tls_env, ca) -> None:
    env, base = tls_env
    with running({**env, "SMQP_PLAIN": "0"}, base, "--host", "127.0.0.1", "--tls-port", "0",
                 expect=("SMQPS",)) as broker:
        assert "SMQP listening" not in broker.log()
        with TLSClient("127.0.0.1", broker.ports["SMQPS"], client_context(ca)) as client:
            assert clear_login(client)[-1].startswith(b"200 Guid: bob")


def test_sighup_reloads_the_certificate(tls_env) -> None:
    env, base = tls_env
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert, key = write_pair(old_ca, base, "reloaded")
    with running({**env, "SMQP_TLS_CERT": str(cert), "SMQP_TLS_KEY": str(key)}, base,
                 "--host", "127.0.0.1", "--port", "0", "--tls-port", "0") as broker:
        port = broker.ports["SMQPS"]
        established = TLSClient("127.0.0.1", port, client_context(old_ca))
        with established:
            # A pair that does not match is refused and the old one kept.
            _, stray_key = write_pair(new_ca, base, "stray")
            key.write_bytes(stray_key.read_bytes())
            broker.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "not reloaded" in broker.log(), broker)
            with TLSClient("127.0.0.1", port, client_context(old_ca)) as client:
                assert client.read_line().startswith(b"SMQP/")
            # The new pair: new handshakes present it, established sessions go on.
            new_cert, new_key = write_pair(new_ca, base, "fresh")
            cert.write_bytes(new_cert.read_bytes())
            key.write_bytes(new_key.read_bytes())
            broker.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "TLS certificate reloaded" in broker.log(), broker)
            with TLSClient("127.0.0.1", port, client_context(new_ca)) as client:
                assert clear_login(client)[-1].startswith(b"200 Guid: bob")
            with pytest.raises(ssl.SSLCertVerificationError):
                TLSClient("127.0.0.1", port, client_context(old_ca))
            assert clear_login(established)[-1].startswith(b"200 Guid: bob")


def wait_for(condition, broker: Listener, seconds: float = 15) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while not condition():
        assert time.monotonic() < deadline, broker.log()
        time.sleep(0.05)


# --- SCRAM-SHA-256-PLUS, password changes ------------------------------------------------------


def scram_exchange(client: RawClient, user: str, password: str,
                   binding: tuple[str, object] | None = None) -> list[bytes] | None:
    """The client's side of a SCRAM exchange after the server's ``200 +``: None once the
    server proved itself (its final ``+ ...`` line verified), else the refusal."""
    from accounts.scram import ScramClient

    scram = ScramClient(user, password, channel_binding=binding)
    client.send_line(base64.b64encode(scram.first()).decode())
    challenge = client.read_line()
    if not challenge.startswith(b"+ "):
        return [challenge]
    client.send_line(base64.b64encode(scram.final(base64.b64decode(challenge[2:]))).decode())
    line = client.read_line()
    if not line.startswith(b"+ "):
        return [line]
    scram.verify(base64.b64decode(line[2:]))
    return None


def scram_login(client: RawClient, user: str, password: str, method: str,
                binding: tuple[str, object] | None = None) -> list[bytes]:
    """A SCRAM login; returns the final reply (or the refusal)."""
    assert client.read_line().startswith(b"SMQP/")
    reply = client.command(f"LOGIN {user} {method}/1.0")
    if reply[-1] != b"200 + \r\n":
        return reply
    return scram_exchange(client, user, password, binding) or client.read_reply()


def end_point(client: TLSClient) -> tuple[str, object]:
    """Bind to the connection: scramp hashes the certificate the server presented."""
    from accounts.scram import TLS_SERVER_END_POINT

    return TLS_SERVER_END_POINT, client.sock


def test_scram_sha_256_plus_login_over_smqps(tls_broker, ca) -> None:
    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        reply = scram_login(client, "bob", "pw", "SCRAM-SHA-256-PLUS", end_point(client))
        assert reply[-1].startswith(b"200 Guid: bob"), reply


def test_scram_plus_bound_to_another_certificate_fails(tls_broker, ca) -> None:
    other = trustme.CA().issue_cert("localhost").cert_chain_pems[0].bytes()
    data = ssl.PEM_cert_to_DER_cert(other.decode())
    from accounts.scram import TLS_SERVER_END_POINT

    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        reply = scram_login(client, "bob", "pw", "SCRAM-SHA-256-PLUS",
                            (TLS_SERVER_END_POINT, hashlib.sha256(data).digest()))
        assert reply == [b"401 Unauthorized\r\n"]


def test_scram_plus_needs_binding_and_tls(tls_broker, ca) -> None:
    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        # PLUS without binding (gs2 flag n) is refused like any failure.
        assert scram_login(client, "bob", "pw", "SCRAM-SHA-256-PLUS") == [
            b"401 Unauthorized\r\n"]
    with RawClient("127.0.0.1", tls_broker.ports["SMQP"]) as client:
        assert client.read_line().startswith(b"SMQP/")
        assert client.command("LOGIN bob SCRAM-SHA-256-PLUS/1.0")[-1].startswith(b"405 ")


def test_scram_sha_256_over_smqps_may_bind(tls_broker, ca) -> None:
    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        assert scram_login(client, "bob", "pw", "SCRAM-SHA-256")[-1].startswith(b"200 Guid:")
    with TLSClient("127.0.0.1", tls_broker.ports["SMQPS"], client_context(ca)) as client:
        reply = scram_login(client, "bob", "pw", "SCRAM-SHA-256", end_point(client))
        assert reply[-1].startswith(b"200 Guid:")


def test_scram_session_changes_its_password_over_smqps(tls_env, ca) -> None:
    env, base = tls_env
    run_manage(env, "shell", "--no-imports", "-c", accounts_script("carol"))
    with running(env, base, "--host", "127.0.0.1", "--port", "0", "--tls-port", "0") as broker:
        port = broker.ports["SMQPS"]
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert scram_login(client, "carol", "pw", "SCRAM-SHA-256-PLUS",
                               end_point(client))[-1].startswith(b"200 Guid:")
            assert client.command("SET LOGIN PASSWORD CLEAR/1.0") == [b"200 OK\r\n"]
            assert client.command("PASS pw n3w-Secret-pw") == [b"200 OK\r\n"]
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert scram_login(client, "carol", "n3w-Secret-pw", "SCRAM-SHA-256-PLUS",
                               end_point(client))[-1].startswith(b"200 Guid:")


def scram_password_change(client: RawClient, user: str, old: str, new: str,
                          method: str = "SCRAM-SHA-256",
                          binding: tuple[str, object] | None = None,
                          new_line: str | None = None) -> list[bytes]:
    """SET LOGIN PASSWORD over SCRAM: prove ``old``, then send ``new`` as a salted key (or
    ``new_line`` as it is)."""
    from accounts.scram import password_verifier

    reply = client.command(f"SET LOGIN PASSWORD {method}/1.0")
    if reply[-1] != b"200 + \r\n":  # after 200-OK
        return reply
    refused = scram_exchange(client, user, old, binding)
    if refused is not None:
        return refused
    client.send_line(new_line if new_line is not None else password_verifier(new, 4096).decode())
    return client.read_reply()


def test_scram_password_change_over_smqps(tls_env, ca) -> None:
    """The new password never crosses the wire: the old one is proved by SCRAM (bound to the
    certificate), the new one sent as its salted key; CLEAR and SCRAM logins then take it."""
    env, base = tls_env
    run_manage(env, "shell", "--no-imports", "-c", accounts_script("dave"))
    with running(env, base, "--host", "127.0.0.1", "--port", "0", "--tls-port", "0") as broker:
        port = broker.ports["SMQPS"]
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert scram_login(client, "dave", "pw", "SCRAM-SHA-256")[-1].startswith(b"200 Guid:")
            # A wrong old password: 401, the session stays, nothing changes.
            assert scram_password_change(client, "dave", "not-pw", "x1-New-pw") == [
                b"401 Unauthorized\r\n"]
            assert scram_password_change(client, "dave", "pw", "n3w-Secret-pw",
                                         "SCRAM-SHA-256-PLUS", end_point(client)) == [
                b"200 OK\r\n"]
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert clear_login(client, "dave", "pw")[-1].startswith(b"401")
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert clear_login(client, "dave", "n3w-Secret-pw")[-1].startswith(b"200 Guid:")
            # A malformed new-password line: 400, and the password stays as it is.
            assert scram_password_change(client, "dave", "n3w-Secret-pw", "",
                                         new_line="s=short,i=4096,p=AAAA")[-1].startswith(b"400 ")
        with TLSClient("127.0.0.1", port, client_context(ca)) as client:
            assert scram_login(client, "dave", "n3w-Secret-pw",
                               "SCRAM-SHA-256")[-1].startswith(b"200 Guid:")


def test_scram_password_change_on_plain_follows_the_clear_rule(tls_env) -> None:
    env, base = tls_env
    run_manage(env, "shell", "--no-imports", "-c", accounts_script("erin"))
    with running({**env, "SMQP_CLEAR_ON_PLAIN": "no"}, base, "--host", "127.0.0.1",
                 "--port", "0", "--tls-port", "0") as broker, \
            RawClient("127.0.0.1", broker.ports["SMQP"]) as client:
        assert scram_login(client, "erin", "pw", "SCRAM-SHA-256")[-1].startswith(b"200 Guid:")
        assert client.command("SET LOGIN PASSWORD SCRAM-SHA-256/1.0")[-1].startswith(b"405 ")
        # PLUS needs TLS: not offered on plain TCP at all.
        assert client.command("SET LOGIN PASSWORD SCRAM-SHA-256-PLUS/1.0")[-1].startswith(
            b"405 ")


def test_password_change_on_plain_follows_the_clear_rule(tls_env) -> None:
    env, base = tls_env
    with running({**env, "SMQP_CLEAR_ON_PLAIN": "no"}, base, "--host", "127.0.0.1",
                 "--port", "0", "--tls-port", "0") as broker, \
            RawClient("127.0.0.1", broker.ports["SMQP"]) as client:
        assert scram_login(client, "bob", "pw", "SCRAM-SHA-256")[-1].startswith(b"200 Guid:")
        assert client.command("SET LOGIN PASSWORD CLEAR/1.0") == [b"200 OK\r\n"]
        assert client.command("PASS pw other-pw")[-1].startswith(b"405 ")
    with running(env, base, "--host", "127.0.0.1", "--port", "0", "--tls-port", "0") as broker, \
            RawClient("127.0.0.1", broker.ports["SMQP"]) as client:
        assert clear_login(client, "bob", "pw")[-1].startswith(b"200 Guid:")  # unchanged


# --- HTTPS and wss:// through Daphne (runbroker) ------------------------------------------------


def test_runbroker_serves_https_and_wss_with_the_smqps_certificate(tls_env, ca) -> None:
    """With SMQP_TLS_CERT set, runbroker's Daphne serves the admin over HTTPS (TLS 1.2+) and
    the XMPP door over wss:// with the same certificate, beside plain HTTP."""
    env, base = tls_env
    names = ("http", "https", "smqp", "smqps", "qqp", "qqps")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    log_path = base / f"runbroker-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runbroker", "--no-celery",
             "--http-port", str(ports["http"]), "--https-port", str(ports["https"]),
             "--smqp-host", "127.0.0.1", "--smqp-port", str(ports["smqp"]),
             "--smqp-tls-port", str(ports["smqps"]), "--qqp-port", str(ports["qqp"])],
            env={**env, "SMQP_QQP_TLS_PORT": str(ports["qqps"])}, cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT)
    try:
        context = client_context(ca)
        deadline = time.monotonic() + scaled(60)
        while True:
            try:
                with socket.create_connection(("127.0.0.1", ports["https"]),
                                              timeout=scaled(5)) as raw, \
                        context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(b"GET /admin/login/ HTTP/1.1\r\nHost: localhost\r\n"
                                b"Connection: close\r\n\r\n")
                    page = b""
                    while chunk := tls.recv(65536):
                        page += chunk
                break
            except OSError:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
        assert page.startswith(b"HTTP/1.1 200"), page[:200]
        assert b"csrfmiddlewaretoken" in page
        assert f"HTTPS and wss:// on 127.0.0.1:{ports['https']}" in log_path.read_text()
        # wss:// for the XMPP door on the same port: a SCRAM login binds a resource.
        from tests.support.xmpp_session import XmppSession

        session = XmppSession(f"wss://localhost:{ports['https']}/xmpp-websocket",
                              sslopt={"context": client_context(ca)})
        try:
            assert session.login("bob", "pw", resource="tls", scram=True).startswith("bob@")
            assert session.iq("get", "<ping xmlns='urn:xmpp:ping'/>", to=None).get(
                "type") == "result"
        finally:
            session.close()
        # The same door refuses a client that does not trust the certificate.
        with pytest.raises(ssl.SSLError):
            XmppSession(f"wss://localhost:{ports['https']}/xmpp-websocket",
                        sslopt={"context": ssl.create_default_context()})
        # A client willing to do TLS 1.1 (its own security level lowered): Daphne refuses.
        old = client_context(ca)
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
        with socket.create_connection(("127.0.0.1", ports["https"]), timeout=scaled(5)) as raw, \
                pytest.raises(ssl.SSLError, match=r"ALERT_PROTOCOL_VERSION|UNEXPECTED_EOF"):
            old.wrap_socket(raw, server_hostname="localhost")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            proc.kill()
