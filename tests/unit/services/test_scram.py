"""SCRAM-SHA-256 (accounts.scram over scramp): RFC 7677 vector, Django hashes, failures, fuzzing.

No database: Django settings (for ``make_password``) come from pytest-django.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from django.contrib.auth.hashers import make_password
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.scram import (
    AUTH_FAILED,
    ScramClient,
    ScramCredentials,
    ScramError,
    ScramServer,
    django_default_iterations,
    dummy_credentials,
)
from tests.support.examples import examples

# RFC 7677 §3
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

SECRET = b"test dummy secret"
ITERATIONS = 4096  # RFC 7677's minimum, which scramp enforces


def make_lookup(accounts: dict[str, ScramCredentials]):
    calls: list[str] = []

    def lookup(username: str) -> ScramCredentials | None:
        calls.append(username)
        return accounts.get(username)

    lookup.calls = calls  # type: ignore[attr-defined]
    return lookup


def make_server(accounts: dict[str, ScramCredentials], **kwargs) -> ScramServer:
    kwargs.setdefault("dummy_iterations", ITERATIONS)
    return ScramServer(make_lookup(accounts), dummy_secret=SECRET, **kwargs)


def rfc_server() -> ScramServer:
    creds = ScramCredentials.from_password("pencil", RFC_SALT, 4096)
    return ScramServer(
        make_lookup({"user": creds}), dummy_secret=SECRET, nonce_factory=lambda: RFC_SERVER_NONCE
    )


def client_final_for(
    bare: bytes, server_first: bytes, password: str, cbind: bytes, proof_len: int = 32
) -> bytes:
    """An independent RFC 5802 client-final computation (for headers ScramClient never sends)."""
    attrs = dict(p.split("=", 1) for p in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = b"c=" + base64.b64encode(cbind) + b",r=" + attrs["r"].encode()
    auth = b",".join((bare, server_first, without_proof))
    sig = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))[:proof_len]
    return without_proof + b",p=" + base64.b64encode(proof)


@pytest.fixture(scope="module")
def alice() -> ScramCredentials:
    return ScramCredentials.from_password("correct horse", b"alicesalt123", ITERATIONS)


def started(accounts: dict[str, ScramCredentials], username: str, password: str, **kw):
    server = make_server(accounts, **kw)
    client = ScramClient(username, password)
    server_first = server.step(client.first())
    return server, client, server_first


# --- RFC 7677 test vector ---------------------------------------------------------------------


def test_rfc7677_vector_client() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)


def test_rfc7677_vector_server() -> None:
    server = rfc_server()
    assert server.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.authenticated
    assert server.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.authenticated
    assert server.username == "user"
    assert server.finished


def test_rfc7677_vector_client_against_server() -> None:
    server = rfc_server()
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.verify(server.step(client.final(server.step(client.first()))))
    assert server.authenticated


def test_client_rejects_wrong_server_signature() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(ScramError, match="server signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


def test_client_reports_server_error() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(ScramError, match="returned an error: invalid-proof"):
        client.verify(b"e=invalid-proof")


@pytest.mark.parametrize(
    "server_first",
    [
        b"r=otherNonce,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",  # not the client's nonce
        b"r=rOprNGfwEbeRWgbNEkqO,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",  # not extended
        b"r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=0",
        b"r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999999",
        b"r=rOprNGfwEbeRWgbNEkqOx,s=,i=4096",
        b"r=rOprNGfwEbeRWgbNEkqOx,s=!!!!,i=4096",
        b"m=x,r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        b"garbage",
        b"\xff\xfe",
    ],
)
def test_client_rejects_bad_server_first(server_first: bytes) -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    with pytest.raises(ScramError):
        client.final(server_first)


# --- Django hashes ----------------------------------------------------------------------------


def test_from_django_hash_matches_from_password() -> None:
    # The project's default hasher (tests.settings: SMQP_PBKDF2_ITERATIONS=4096).
    encoded = make_password("s3cret pässword", "fixedsalt123")
    algorithm, iterations, salt, _ = encoded.split("$")
    assert (algorithm, int(iterations), salt) == ("pbkdf2_sha256", ITERATIONS, "fixedsalt123")
    creds = ScramCredentials.from_django_hash(encoded)
    assert creds == ScramCredentials.from_password("s3cret pässword", b"fixedsalt123", ITERATIONS)
    assert creds.salt == b"fixedsalt123"
    assert creds.iterations == ITERATIONS


def test_from_django_hash_matches_stock_django_hasher() -> None:
    # get_hasher("pbkdf2_sha256") is Django's own PBKDF2PasswordHasher (its default count).
    encoded = make_password("pencil", "stocksalt", hasher="pbkdf2_sha256")
    _, iterations, _, _ = encoded.split("$")
    assert ScramCredentials.from_django_hash(encoded) == ScramCredentials.from_password(
        "pencil", "stocksalt", int(iterations)
    )


def test_from_django_hash_random_salt() -> None:
    encoded = make_password("another one")
    _, iterations, salt, _ = encoded.split("$")
    assert ScramCredentials.from_django_hash(encoded) == ScramCredentials.from_password(
        "another one", salt, int(iterations)
    )


@pytest.mark.parametrize("password", ["correct horse battery", "pässwörd ☃", "a,b=c"])
def test_round_trip_against_django_hash(password: str) -> None:
    creds = ScramCredentials.from_django_hash(make_password(password))
    server = make_server({"bob": creds})
    client = ScramClient("bob", password)
    server_first = server.step(client.first())
    assert f",i={ITERATIONS}".encode() in server_first
    client.verify(server.step(client.final(server_first)))
    assert server.authenticated
    assert server.username == "bob"


def test_lookup_may_raise_scram_error_for_unusable_hash() -> None:
    unusable = make_password(None)

    def lookup(username: str) -> ScramCredentials | None:
        return ScramCredentials.from_django_hash(unusable)

    server = ScramServer(lookup, dummy_secret=SECRET)
    client = ScramClient("carol", "whatever")
    server_first = server.step(client.first())
    with pytest.raises(ScramError, match=AUTH_FAILED):
        server.step(client.final(server_first))


@pytest.mark.parametrize(
    "encoded",
    [
        "!unusablepasswordxxxxxxxxxxxxxxxxxxxxxxxxx",
        "argon2$argon2id$v=19$m=102400,t=2,p=8$c29tZXNhbHQ$aGFzaA",
        "pbkdf2_sha1$260000$salt$aGFzaGhhc2hoYXNoaGFzaGhhc2g=",
        "bcrypt_sha256$$2b$12$abcdefghijklmnopqrstuv",
        "pbkdf2_sha256$abc$salt$" + base64.b64encode(b"x" * 32).decode(),
        "pbkdf2_sha256$0$salt$" + base64.b64encode(b"x" * 32).decode(),
        "pbkdf2_sha256$-5$salt$" + base64.b64encode(b"x" * 32).decode(),
        "pbkdf2_sha256$1000$$" + base64.b64encode(b"x" * 32).decode(),
        "pbkdf2_sha256$1000$salt$" + base64.b64encode(b"x" * 31).decode(),
        "pbkdf2_sha256$1000$salt$not base64!",
        "pbkdf2_sha256$1000$salt",
        "",
    ],
)
def test_from_django_hash_rejects(encoded: str) -> None:
    with pytest.raises(ScramError) as excinfo:
        ScramCredentials.from_django_hash(encoded)
    assert "$" not in str(excinfo.value)


def test_from_django_hash_rejects_real_unusable_password() -> None:
    with pytest.raises(ScramError, match="not a pbkdf2_sha256"):
        ScramCredentials.from_django_hash(make_password(None))


def test_credentials_repr_hides_keys(alice: ScramCredentials) -> None:
    text = repr(alice)
    assert alice.stored_key.hex() not in text and repr(alice.stored_key) not in text
    assert repr(alice.server_key) not in text


def test_django_default_iterations() -> None:
    assert django_default_iterations() == ITERATIONS


# --- failures and enumeration -----------------------------------------------------------------


def test_wrong_password_and_unknown_account_fail_alike(alice: ScramCredentials) -> None:
    errors = []
    firsts = []
    for username, password in (("alice", "wrong"), ("mallory", "anything")):
        server, client, server_first = started({"alice": alice}, username, password)
        firsts.append(server_first)
        with pytest.raises(ScramError) as excinfo:
            server.step(client.final(server_first))
        errors.append(str(excinfo.value))
        assert not server.authenticated
    assert errors == [AUTH_FAILED, AUTH_FAILED]
    # Same shape of server-first: same iteration count, Django-shaped salt for the unknown one.
    real, fake = (dict(p.split("=", 1) for p in f.decode().split(",")) for f in firsts)
    assert real["i"] == fake["i"] == str(ITERATIONS)
    fake_salt = base64.b64decode(fake["s"])
    assert len(fake_salt) == 22 and fake_salt.isalnum()


def test_dummy_credentials_are_deterministic() -> None:
    a = dummy_credentials("mallory", SECRET)
    assert a == dummy_credentials("mallory", SECRET)
    assert a.salt != dummy_credentials("mallory2", SECRET).salt
    assert a.salt != dummy_credentials("mallory", b"other secret").salt
    assert dummy_credentials("mallory", SECRET, iterations=10_000).iterations == 10_000
    # Below RFC 7677's minimum the fake would be told apart (scramp refuses it): raised.
    assert dummy_credentials("mallory", SECRET, iterations=1234).iterations == ITERATIONS


def test_unknown_account_is_offered_a_stable_salt() -> None:
    firsts = [started({}, "ghost", "pw")[2].split(b",")[1] for _ in range(2)]
    assert firsts[0] == firsts[1]


def test_dummy_key_folds_names_like_lookup() -> None:
    salts = {
        started({}, name, "pw", dummy_key=str.casefold)[2].split(b",")[1]
        for name in ("Ghost", "GHOST", "ghost")
    }
    assert len(salts) == 1


def test_unknown_account_fails_even_if_proof_matches_dummy_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should a proof ever match the fake keys, an unknown account is still refused."""
    known = ScramCredentials.from_password("pw", b"salt12345678", ITERATIONS)
    monkeypatch.setattr("accounts.scram.dummy_credentials", lambda *args, **kwargs: known)
    server, client, server_first = started({}, "ghost", "pw")
    with pytest.raises(ScramError, match=f"^{AUTH_FAILED}$"):
        server.step(client.final(server_first))
    # ...whereas the same keys behind a real account succeed.
    server, client, server_first = started({"ghost": known}, "ghost", "pw")
    client.verify(server.step(client.final(server_first)))


def test_tampered_nonce(alice: ScramCredentials) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    final = client.final(server_first)
    nonce = server_first.split(b",")[0][2:]
    with pytest.raises(ScramError, match="nonce doesn't match"):
        server.step(final.replace(nonce, nonce[:-1] + (b"A" if nonce[-1:] != b"A" else b"B")))


def test_client_final_nonce_must_be_whole(alice: ScramCredentials) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    final = client.final(server_first)
    nonce = server_first.split(b",")[0][2:]
    with pytest.raises(ScramError, match="nonce doesn't match"):
        server.step(final.replace(nonce, nonce[:20]))


@pytest.mark.parametrize("cbind", [b"eSws", b"cD10bHMtdW5pcXVlLCw=", b""])
def test_tampered_channel_binding(alice: ScramCredentials, cbind: bytes) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    final = client.final(server_first)
    assert final.startswith(b"c=biws,")
    with pytest.raises(ScramError, match=r"channel-bindings-dont-match|Malformed"):
        server.step(b"c=" + cbind + final[len(b"c=biws") :])


def test_tampered_proof(alice: ScramCredentials) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    final = client.final(server_first)
    head, proof = final.rsplit(b",p=", 1)
    raw = bytearray(base64.b64decode(proof))
    raw[0] ^= 1
    with pytest.raises(ScramError, match=f"^{AUTH_FAILED}$"):
        server.step(head + b",p=" + base64.b64encode(bytes(raw)))


@pytest.mark.parametrize("length", [0, 31])
def test_short_proof(alice: ScramCredentials, length: int) -> None:
    server = make_server({"alice": alice})
    bare = b"n=alice,r=nonce"
    server_first = server.step(b"n,," + bare)
    final = client_final_for(bare, server_first, "correct horse", b"n,,", proof_len=length)
    with pytest.raises(ScramError, match=f"^{AUTH_FAILED}$|Malformed"):
        server.step(final)


def test_y_flag_accepted_with_matching_binding(alice: ScramCredentials) -> None:
    server = make_server({"alice": alice})
    bare = b"n=alice,r=nonce"
    server_first = server.step(b"y,," + bare)
    final = client_final_for(bare, server_first, "correct horse", b"y,,")
    assert final.startswith(b"c=eSws,")
    assert server.step(final).startswith(b"v=")
    assert server.authenticated


def test_y_flag_rejects_n_binding(alice: ScramCredentials) -> None:
    server = make_server({"alice": alice})
    bare = b"n=alice,r=nonce"
    server_first = server.step(b"y,," + bare)
    with pytest.raises(ScramError, match="channel-bindings-dont-match"):
        server.step(client_final_for(bare, server_first, "correct horse", b"n,,"))


@pytest.mark.parametrize("authzid", [b"alice", b"root"])
def test_authzid_refused(alice: ScramCredentials, authzid: bytes) -> None:
    # No proxy authorization in the broker: scramp refuses any authzid, even the own name.
    with pytest.raises(ScramError, match="authzid must be empty"):
        make_server({"alice": alice}).step(b"n,a=" + authzid + b",n=alice,r=nonce")


def test_channel_binding_not_supported() -> None:
    with pytest.raises(ScramError, match=r"^channel-binding-not-supported"):
        make_server({}).step(b"p=tls-server-end-point,,n=alice,r=nonce")


def test_mandatory_extension_rejected() -> None:
    with pytest.raises(ScramError, match="extensions-not-supported"):
        make_server({}).step(b"n,,m=ext,n=alice,r=nonce")


def test_optional_extensions_tolerated(alice: ScramCredentials) -> None:
    server = make_server({"alice": alice})
    bare = b"n=alice,r=nonce,x=some value"
    server_first = server.step(b"n,," + bare)
    server.step(client_final_for(bare, server_first, "correct horse", b"n,,"))
    assert server.authenticated


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n",
        b"n,",
        b"n,,",
        b"x,,n=alice,r=nonce",
        b"n,,n=alice",
        b"n,,r=nonce,n=alice",
        b"n,,n=,r=nonce",
        b"n,,n=alice,r=",
        b"n,,n=alice,r=non ce",
        b"n,,n=alice,r=non\x7fce",
        b"n,,n=al=ice,r=nonce",
        b"n,,n=al=2cice,r=nonce",
        b"n,,n=al=2Dice,r=nonce",
        b"n,,n=alice=,r=nonce",
        b"n,,n=al\x00ice,r=nonce",
        b"n,,n=alice,r=nonce,",
        b"n,,n=alice,r=nonce,xx=1",
        b"n,,n=alice,r=nonce,x=",
        b"n,a=,n=alice,r=nonce",
        b"n,b=alice,n=alice,r=nonce",
        b"p=,,n=alice,r=nonce",
        b"p=bad name,,n=alice,r=nonce",
        b"N,,n=alice,r=nonce",
        b"n,,n=\xff\xfe,r=nonce",
        b"n,,n=" + b"a" * 5000 + b",r=nonce",
    ],
)
def test_garbage_client_first(message: bytes) -> None:
    server = make_server({})
    with pytest.raises(ScramError):
        server.step(message)
    assert server.finished and not server.authenticated
    with pytest.raises(ScramError, match="already finished"):
        server.step(b"n,,n=alice,r=nonce")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: b"",
        lambda f: b"garbage",
        lambda f: f.split(b",p=")[0],  # no proof
        lambda f: f + b",p=AAAA",  # proof not last-only
        lambda f: f.replace(b"c=biws", b"c=biw"),  # bad base64
        lambda f: f.replace(b"c=biws", b"c=bi!s"),
        lambda f: f.replace(b",p=", b",q="),
        lambda f: f.replace(b"c=", b"x="),
        lambda f: f.replace(b",r=", b",s="),
        lambda f: f.replace(b",p=", b",m=x,p="),
        lambda f: f.replace(b",p=", b",p====="),
        lambda f: f.replace(b",p=", b",x=,p="),
        lambda f: f[:-1],  # truncated base64 padding
        lambda f: f + b"\xff",
        lambda f: f + b"A" * 5000,
    ],
)
def test_garbage_client_final(alice: ScramCredentials, mutate) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    with pytest.raises(ScramError):
        server.step(mutate(client.final(server_first)))
    assert server.finished and not server.authenticated


def test_step_after_success_raises(alice: ScramCredentials) -> None:
    server, client, server_first = started({"alice": alice}, "alice", "correct horse")
    server.step(client.final(server_first))
    with pytest.raises(ScramError, match="already finished"):
        server.step(b"n,,n=alice,r=nonce")


def test_non_bytes_message_is_scram_error() -> None:
    with pytest.raises(ScramError):
        make_server({}).step("n,,n=alice,r=nonce")  # type: ignore[arg-type]


def test_client_state_errors() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    with pytest.raises(ScramError):
        client.final(RFC_SERVER_FIRST)
    client.first()
    with pytest.raises(ScramError):
        client.first()
    with pytest.raises(ScramError):
        client.verify(RFC_SERVER_FINAL)
    with pytest.raises(ScramError):
        ScramClient("user", "pencil", nonce="has,comma")


# --- username escaping ------------------------------------------------------------------------


@pytest.mark.parametrize("username", ["a,b", "a=b", "=2C", ",=,=", "x=3Dy", "ünï,cødé="])
def test_username_escaping_round_trip(username: str) -> None:
    creds = ScramCredentials.from_password("pw", b"salt12345678", ITERATIONS)
    lookup = make_lookup({username: creds})
    server = ScramServer(lookup, dummy_secret=SECRET, dummy_iterations=ITERATIONS)
    client = ScramClient(username, "pw")
    first = client.first()
    assert b"," not in first[len(b"n,,n=") :].split(b",r=")[0]
    client.verify(server.step(client.final(server.step(first))))
    assert server.authenticated
    assert server.username == username
    assert lookup.calls == [username]  # type: ignore[attr-defined]


def test_escaped_username_on_the_wire() -> None:
    assert ScramClient("a,b=c", "pw", nonce="n").first() == b"n,,n=a=2Cb=3Dc,r=n"


# --- fuzzing ----------------------------------------------------------------------------------

_FUZZ_SETTINGS = settings(
    max_examples=examples(300), deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_SCRAM_ALPHABET = st.sampled_from(list(b"nyparcsvmie=,2CD3AZbiws+/\x00\xff\xc3 "))
_SCRAMMY = st.lists(_SCRAM_ALPHABET, max_size=60).map(bytes)
_FUZZ_CREDS = ScramCredentials.from_password("pw", b"salt12345678", ITERATIONS)


def _fuzz_server() -> ScramServer:
    return ScramServer(make_lookup({"alice": _FUZZ_CREDS}), dummy_secret=SECRET,
                       dummy_iterations=ITERATIONS)


def _after_first(username: bytes = b"alice") -> ScramServer:
    server = _fuzz_server()
    server.step(b"n,,n=" + username + b",r=nonce")
    return server


@_FUZZ_SETTINGS
@given(st.one_of(st.binary(max_size=200), _SCRAMMY))
def test_fuzz_client_first(data: bytes) -> None:
    server = _fuzz_server()
    try:
        reply = server.step(data)
    except ScramError:
        assert server.finished
    else:
        assert reply.startswith(b"r=")


@_FUZZ_SETTINGS
@given(st.one_of(st.binary(max_size=200), _SCRAMMY), st.sampled_from([b"alice", b"ghost"]))
def test_fuzz_client_final(data: bytes, username: bytes) -> None:
    server = _after_first(username)
    with pytest.raises(ScramError):
        server.step(data)
    assert not server.authenticated


@_FUZZ_SETTINGS
@given(st.binary(max_size=100), st.integers(min_value=0, max_value=200), st.binary(max_size=8))
def test_fuzz_mutated_client_final(data: bytes, pos: int, insert: bytes) -> None:
    server = _fuzz_server()
    client = ScramClient("alice", "pw")
    final = client.final(server.step(client.first()))
    mutated = final[:pos] + insert + final[pos + len(insert) :] + data
    try:
        server.step(mutated)
    except ScramError:
        assert not server.authenticated
    else:
        assert mutated == final  # only the untouched message can succeed


@_FUZZ_SETTINGS
@given(st.binary(max_size=100))
def test_fuzz_after_finish(data: bytes) -> None:
    server = _fuzz_server()
    client = ScramClient("alice", "pw")
    server.step(client.final(server.step(client.first())))
    with pytest.raises(ScramError, match="already finished"):
        server.step(data)


@_FUZZ_SETTINGS
@given(st.one_of(st.binary(max_size=200), _SCRAMMY))
def test_fuzz_client_inputs(data: bytes) -> None:
    client = ScramClient("alice", "pw", nonce="nonce")
    client.first()
    try:
        client.final(data)
    except ScramError:
        pass
    else:
        assert data.startswith(b"r=nonce")
