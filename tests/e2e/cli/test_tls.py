"""``smqp --tls --cafile``: the CLI over SMQPS against a real TLS listener (a trustme CA),
and a certificate it cannot verify refused in one line with exit status 3."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import trustme

from tests.conftest import accounts_script, fresh_database, run_manage
from tests.e2e.cli.test_smqp import smqp
from tests.e2e.smqp.test_tls import Listener, running, write_pair

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls(tmp_path_factory, ca) -> Iterator[tuple[Listener, dict[str, str], str]]:
    base = tmp_path_factory.mktemp("cli-tls")
    cert, key = write_pair(ca, base, "server")
    cafile = base / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    with fresh_database("sqlite", base,
                        {"SMQP_TLS_CERT": str(cert), "SMQP_TLS_KEY": str(key)}) as env:
        run_manage(env, "shell", "--no-imports", "-c", accounts_script("root"))
        with running(env, base, "--host", "127.0.0.1", "--port", "0",
                     "--tls-port", "0") as listener:
            yield listener, env, str(cafile)


def client_env(port: int) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}
    env.update(SMQP_HOST="127.0.0.1", SMQP_PORT=str(port), SMQP_ACCOUNT="root",
               SMQP_PASSWORD="pw")
    return env


def test_pub_and_get_over_tls(tls):
    listener, _, cafile = tls
    env = client_env(listener.ports["SMQPS"])
    pub = smqp(env, "--tls", "--cafile", cafile, "pub", "/accounts/root", "secret", "--json")
    assert pub.returncode == 0, pub.stderr
    smuid = json.loads(pub.stdout)["smuid"]
    got = smqp(env, "--tls", "--cafile", cafile, "get", "/accounts/root", str(smuid), "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.splitlines()[0])["sections"][0]["text"] == "secret"


def test_unverifiable_certificate_is_one_line(tls):
    listener, _, _ = tls
    env = client_env(listener.ports["SMQPS"])
    result = smqp(env, "--tls", "topics")  # the system CAs do not know the test CA
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smqp: error: TLS with 127.0.0.1:")
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0] or "verify" in lines[0].lower()


def test_plain_client_on_the_tls_port_is_one_line(tls):
    listener, _, cafile = tls
    env = client_env(listener.ports["SMQPS"])
    # Options work after the command name as well as before it.
    result = smqp(env, "topics", "--timeout", "2")
    assert result.returncode == 3
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("smqp: error: no greeting from 127.0.0.1:") and "--tls" in line
    ok = smqp(env, "topics", "--tls", "--cafile", cafile, "--json")
    assert ok.returncode == 0, ok.stderr
    assert "/accounts" in json.loads(ok.stdout)["topics"]
