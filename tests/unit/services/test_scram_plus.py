"""SCRAM-SHA-256-PLUS (accounts.scram over scramp, ``tls-server-end-point`` channel binding)."""

from __future__ import annotations

import hashlib
import ssl

import pytest
import trustme

from accounts.scram import (
    TLS_SERVER_END_POINT,
    ScramClient,
    ScramCredentials,
    ScramError,
    ScramServer,
)

SECRET = b"test dummy secret"
CREDS = ScramCredentials.from_password("pw", b"salt12345678", 4096)
BINDING = (TLS_SERVER_END_POINT, b"\x01" * 32)


def server(**kwargs) -> ScramServer:
    return ScramServer(lambda name: CREDS if name == "alice" else None, dummy_secret=SECRET,
                       dummy_iterations=4096, **kwargs)


def run(srv: ScramServer, client: ScramClient) -> None:
    client.verify(srv.step(client.final(srv.step(client.first()))))


def _certificate() -> tuple[str, bytes]:
    pem = trustme.CA().issue_cert("localhost").cert_chain_pems[0].bytes().decode()
    return pem, ssl.PEM_cert_to_DER_cert(pem)


def test_server_binds_to_the_certificate_hash() -> None:
    """Given the certificate (PEM, as the SMQPS door passes it), the server binds to its hash
    (RFC 5929 §4.1: SHA-256 for a SHA-256-signed certificate), computed here independently."""
    pem, der = _certificate()
    srv = server(channel_binding=(TLS_SERVER_END_POINT, pem), require_binding=True)
    run(srv, ScramClient("alice", "pw",
                         channel_binding=(TLS_SERVER_END_POINT, hashlib.sha256(der).digest())))
    assert srv.authenticated


def test_another_certificate_does_not_bind() -> None:
    pem, _ = _certificate()
    _, other_der = _certificate()
    srv = server(channel_binding=(TLS_SERVER_END_POINT, pem), require_binding=True)
    client = ScramClient("alice", "pw", channel_binding=(
        TLS_SERVER_END_POINT, hashlib.sha256(other_der).digest()))
    with pytest.raises(ScramError, match="channel-bindings-dont-match"):
        srv.step(client.final(srv.step(client.first())))


@pytest.mark.parametrize("require", [True, False])
def test_bound_exchange(require: bool) -> None:
    srv = server(channel_binding=BINDING, require_binding=require)
    client = ScramClient("alice", "pw", channel_binding=BINDING)
    first = client.first()
    assert first.startswith(b"p=tls-server-end-point,,n=alice,")
    client.verify(srv.step(client.final(srv.step(first))))
    assert srv.authenticated


def test_other_binding_data_fails() -> None:
    srv = server(channel_binding=BINDING, require_binding=True)
    client = ScramClient("alice", "pw", channel_binding=(TLS_SERVER_END_POINT, b"\x02" * 32))
    with pytest.raises(ScramError, match="channel-bindings-dont-match"):
        srv.step(client.final(srv.step(client.first())))
    assert not srv.authenticated


def test_plus_requires_binding() -> None:
    with pytest.raises(ScramError, match="server-does-support-channel-binding"):
        server(channel_binding=BINDING, require_binding=True).step(b"n,,n=alice,r=nonce")


def test_y_flag_is_a_downgrade_where_binding_is_possible() -> None:
    with pytest.raises(ScramError, match="server-does-support-channel-binding"):
        server(channel_binding=BINDING).step(b"y,,n=alice,r=nonce")


def test_unbound_client_on_a_binding_server() -> None:
    srv = server(channel_binding=BINDING)
    run(srv, ScramClient("alice", "pw"))
    assert srv.authenticated


def test_other_binding_type_not_supported() -> None:
    with pytest.raises(ScramError, match="unsupported-channel-binding-type"):
        server(channel_binding=BINDING).step(b"p=tls-unique,,n=alice,r=nonce")


def test_unknown_account_fails_alike_when_bound() -> None:
    srv = server(channel_binding=BINDING, require_binding=True)
    client = ScramClient("ghost", "pw", channel_binding=BINDING)
    with pytest.raises(ScramError, match=r"^authentication failed$"):
        srv.step(client.final(srv.step(client.first())))


def test_require_binding_needs_binding() -> None:
    with pytest.raises(ValueError):
        server(require_binding=True)
