"""The QQP door through real sockets: ``runqqp`` beside ``runsmqp`` on a fresh database."""

from __future__ import annotations

import random
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from broker.qqp import netstring, protocol, sxdf
from broker.qqp.send import QQPSender
from broker.qqp.send import main as send_main
from tests.conftest import (
    PG_ADMIN_URL,
    ROOT,
    BrokerProcess,
    fresh_database,
    listener,
    manage_many,
    query_database,
    stop_listener,
)
from tests.support.smqp_session import Session, header
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e


def start_qqp(env: dict[str, str], var_dir: Path, *extra: str) -> BrokerProcess:
    log_path = var_dir / f"qqp-{uuid.uuid4().hex[:6]}.log"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runqqp", "--host", "127.0.0.1", "--port", "0",
         *extra],
        env=env, cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        log = log_path.read_text()
        match = re.search(r"QQP listening on ([\d.]+):(\d+)", log)
        if match and ("--tls-cert" not in extra or "QQPS listening" in log):
            broker = BrokerProcess(match[1], int(match[2]), env, proc, var_dir, log_path)
            tls = re.search(r"QQPS listening on [\d.]+:(\d+)", log)
            broker.extra["tls_port"] = int(tls[1]) if tls else None
            return broker
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"runqqp did not start:\n{log_path.read_text()}")


@contextmanager
def qqp_broker(backend: str, base: Path, **settings: str) -> Iterator[tuple]:
    """(the SMQP listener, the QQP listener) on a fresh database with ``root``, ``bob``, and
    the topic /qqp; unsigned items from loopback are published as root."""
    extra = {"SMQP_QQP_UNSIGNED_ACCOUNT": "root", **settings}
    with fresh_database(backend, base, extra, accounts=("root", "bob")) as env, \
            listener(env, base, name=f"smqp-{backend}") as smqp:
        with Session(smqp.host, smqp.port, "root") as root:
            assert root.command("CREATE TOPIC /qqp").code == 200
        qqp = start_qqp(env, base)
        try:
            yield smqp, qqp
        finally:
            stop_listener(qqp)


def stored_rows(env: dict[str, str]) -> list[tuple[str, bytes]]:
    """(Cmuid, first section) of every stored message, in smuid order."""
    rows = query_database(env, """
        SELECT m.cmuid, s.body FROM broker_message m JOIN broker_datasection s
          ON s.message_id = m.id AND s.position = (
            SELECT MIN(position) FROM broker_datasection WHERE message_id = m.id)
        ORDER BY m.id""")
    return [(cmuid, bytes(body)) for cmuid, body in rows]


def item(rid: str, payload: bytes = b"hello", topic: str = "/qqp") -> dict:
    return {"Action": f"smqp:{topic}".encode(), "ResourceID": rid.encode(), "Payload": payload}


def test_greeting_store_deliver_and_duplicates(tmp_path, capsys):
    with qqp_broker("sqlite", tmp_path, SMQP_QQP_ITEM_LIMIT="4000") as (smqp, qqp), \
            Session(smqp.host, smqp.port, "root") as sub:
        assert sub.command("SUB MESSAGE /qqp").code == 200
        with QQPSender(qqp.host, qqp.port) as sender:
            greeting = sender.greeting
            assert greeting.item_limit == 4000
            assert greeting.session_limit > 0
            assert greeting.capabilities == ("smqp",)
            code, text = sender.send(item("r-1", b"first payload"))
            assert code == 2, text
            msg = sub.message()
            assert header(msg, "X-Resource-Id") == "r-1"
            section = msg.message.sections[0]
            assert section.get("Content-Type") == "application/x-sxdf"
            assert sxdf.parse_value(section.body) == item("r-1", b"first payload")
            sub.ack()
            code, text = sender.send(item("r-1", b"first payload"))
            assert code == 1, text
            assert sender.send(item("r-2"))[0] == 2
        with QQPSender(qqp.host, qqp.port) as again:  # a new connection: still a duplicate
            assert again.send(item("r-2"))[0] == 1
            # No such topic: permanent, and the connection closes.
            assert again.send(item("r-3", topic="/nowhere"))[0] == 5
            with pytest.raises(ConnectionError):
                again.send(item("r-4"))
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["r-1", "r-2"]
        # Over the ItemLimit: 5 and closed, before the body is read.
        with QQPSender(qqp.host, qqp.port) as big:
            code, text = big.send(item("r-big", b"x" * 5000))
            assert code == 5 and "ItemLimit" in text
            with pytest.raises(ConnectionError):
                big.send(item("r-5"))
        # A malformed netstring: 5 and closed.
        with QQPSender(qqp.host, qqp.port) as bad:
            assert bad.send_raw(b"012:abc,")[0] == 5
        # A whole item, then a fault in the same write: the item answered, then 5 and closed.
        with QQPSender(qqp.host, qqp.port) as mixed:
            assert mixed.send_raw(protocol.encode_item(item("r-6")) + b"x:")[0] == 2
            assert protocol.parse_status(mixed._next())[0] == 5
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["r-1", "r-2", "r-6"]
        assert qqp.alive()
        # The operators' sender: a file sent twice is stored once.
        payload = tmp_path / "payload.bin"
        payload.write_bytes(b"from a file")
        argv = ["--host", qqp.host, "--port", str(qqp.port), "--topic", "/qqp", str(payload)]
        assert send_main(argv) == 0
        assert send_main(argv) == 0
        assert "100 redundant" in capsys.readouterr().out
        rows = stored_rows(smqp.env)
        assert len(rows) == 4 and sxdf.parse_value(rows[-1][1])["Payload"] == b"from a file"


def test_session_limit_and_unsigned_refusal(tmp_path):
    one = len(protocol.encode_item(item("s-0")))
    with qqp_broker("sqlite", tmp_path, SMQP_QQP_SESSION_LIMIT=str(2 * one + 5)) as (smqp, qqp):
        with QQPSender(qqp.host, qqp.port) as sender:
            assert sender.greeting.session_limit == 2 * one + 5
            assert sender.send(item("s-0"))[0] == 2
            code, text = sender.send(item("s-1"))
            assert code == 2, text  # 5 bytes left: still room for a tiny item
            assert sender.send_raw(netstring.encode(b"x"))[0] == 5  # 4 bytes: over
        with QQPSender(qqp.host, qqp.port) as sender:
            assert sender.send(item("s-2"))[0] == 2
            code, text = sender.send(item("s-3" + "x" * 6))
            assert code == 5 and "SessionLimit" in text
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["s-0", "s-1", "s-2"]
    with qqp_broker("sqlite", tmp_path / "far", SMQP_QQP_UNSIGNED_FROM="10.0.0.0/8") as (
            smqp, qqp), QQPSender(qqp.host, qqp.port) as sender:
        code, text = sender.send(item("u-1"))
        assert code == 5 and "unsigned" in text and "SMQP_QQP_UNSIGNED_FROM" in text
        assert stored_rows(smqp.env) == []


def test_session_limit_reached_exactly_closes_with_3(tmp_path):
    one = len(protocol.encode_item(item("e-0")))
    with qqp_broker("sqlite", tmp_path, SMQP_QQP_SESSION_LIMIT=str(one)) as (smqp, qqp), \
            QQPSender(qqp.host, qqp.port) as sender:
        assert sender.send(item("e-0"))[0] == 3
        with pytest.raises(ConnectionError):
            sender.send(item("e-1"))
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["e-0"]


def test_database_down_gives_4_and_stores_nothing(tmp_path):
    with qqp_broker("postgres", tmp_path) as (smqp, qqp), \
            QQPSender(qqp.host, qqp.port) as sender:
        assert sender.send(item("d-1"))[0] == 2
        database = smqp.env["DATABASE_URL"].rsplit("/", 1)[1]
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (database,))
        try:
            code, text = sender.send(item("d-2"))
            assert code == 4, text
        finally:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["d-1"]
        assert qqp.alive()
        with QQPSender(qqp.host, qqp.port) as retry:  # the store is back: the retry is stored
            assert retry.send(item("d-2"))[0] == 2
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["d-1", "d-2"]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(buf))
        op = rng.randrange(3)
        if op == 0:
            del buf[pos]
        elif op == 1:
            buf.insert(pos, rng.choice(b"0123456789:,%@=\n "))
        else:
            buf[pos] = rng.randrange(256)
    return bytes(buf)


def test_fuzz_through_the_socket(tmp_path):
    """10,000 mutated streams: the listener stays up, and whatever it stored is a whole item."""
    rng = random.Random(28)
    seeds = [protocol.encode_item(item(f"f-{i}", b"p" * i)) for i in range(5)]
    with qqp_broker("sqlite", tmp_path) as (smqp, qqp):
        for _ in range(10_000):
            stream = _mutate(rng, b"".join(rng.sample(seeds, 2)))
            with socket.create_connection((qqp.host, qqp.port), timeout=scaled(10)) as sock:
                sock.sendall(stream)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
        assert qqp.alive()
        assert "application failed" not in qqp.log()
        with QQPSender(qqp.host, qqp.port) as sender:
            assert sender.send(item("after-fuzz"))[0] == 2
        for rid, body in stored_rows(smqp.env):
            data = sxdf.parse_value(body)
            assert data["ResourceID"].decode() == rid
            assert data["Action"] == b"smqp:/qqp"


def _signing_key():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgpy
        from pgpy.constants import EllipticCurveOID, HashAlgorithm, KeyFlags, PubKeyAlgorithm

        key = pgpy.PGPKey.new(PubKeyAlgorithm.EdDSA, EllipticCurveOID.Ed25519)
        key.add_uid(pgpy.PGPUID.new("Bob", email="bob@example.org"), usage={KeyFlags.Sign},
                    hashes=[HashAlgorithm.SHA256])
    return key


def _sign(key, data: bytes) -> bytes:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return str(key.sign(data)).encode()


def test_signed_items_are_published_as_the_key_s_account(tmp_path):
    bob_key, stranger_key = _signing_key(), _signing_key()
    key_file = tmp_path / "bob.asc"
    key_file.write_text(str(bob_key.pubkey))
    with qqp_broker("sqlite", tmp_path, SMQP_QQP_UNSIGNED_FROM="10.0.0.0/8") as (smqp, qqp):
        manage_many(smqp.env, ("qqpkey", "bob", str(key_file)),  # one start: ~2 s CPU
                    ("grant", "bob", "/qqp", "publish"))
        data = item("sig-1", topic="/qqp")
        with QQPSender(qqp.host, qqp.port) as sender:
            code, text = sender.send(data, _sign(bob_key, sxdf.canonical(data)))
            assert code == 2, text
            # The same ResourceID from the same publisher: redundant.
            assert sender.send(data, _sign(bob_key, sxdf.canonical(data)))[0] == 1
        with QQPSender(qqp.host, qqp.port) as sender:  # signed over other bytes
            other = item("sig-2", topic="/qqp")
            code, text = sender.send(other, _sign(bob_key, sxdf.canonical(data)))
            assert code == 5 and "signature" in text
        with QQPSender(qqp.host, qqp.port) as sender:  # a key no account keeps
            other = item("sig-3", topic="/qqp")
            code, text = sender.send(other, _sign(stranger_key, sxdf.canonical(other)))
            assert code == 5 and "signature" in text
        with QQPSender(qqp.host, qqp.port) as sender:  # not a signature at all
            assert sender.send(item("sig-4", topic="/qqp"), b"garbage")[0] == 5
        assert query_database(smqp.env, """
            SELECT m.cmuid, a.username FROM broker_message m
              LEFT JOIN accounts_account a ON a.id = m.publisher_id""") == [("sig-1", "bob")]


def test_qqps_over_tls(tmp_path):
    import trustme

    cert = trustme.CA().issue_cert("localhost", "127.0.0.1")
    cert_path, key_path = tmp_path / "qqp.pem", tmp_path / "qqp.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    with qqp_broker("sqlite", tmp_path) as (smqp, _):
        qqps = start_qqp(smqp.env, tmp_path, "--tls-port", "0", "--tls-cert", str(cert_path),
                         "--tls-key", str(key_path))
        try:
            with QQPSender(qqps.host, qqps.extra["tls_port"], tls=True, verify=False) as sender:
                assert sender.greeting.capabilities == ("smqp",)
                assert sender.send(item("tls-1"))[0] == 2
        finally:
            stop_listener(qqps)
        assert [rid for rid, _ in stored_rows(smqp.env)] == ["tls-1"]
