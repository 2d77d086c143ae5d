"""SCRAM-SHA-256 and SCRAM-SHA-256-PLUS (RFC 5802, RFC 7677; channel binding
``tls-server-end-point``, RFC 5929): an adapter over the ``scramp`` library.

scramp does the protocol: message grammar, nonces, proofs, signatures, channel binding (it
hashes the server certificate itself) and the RFC 5802 state machine. This module adds what
scramp leaves to its user, and keeps the broker's guarantees (profile §5):

- Credentials come straight from the PBKDF2-SHA256 hashes Django already stores, so no plaintext
  password and no extra per-account secret is kept. A Django hash
  ``pbkdf2_sha256$<iterations>$<salt>$<base64 hash>`` stores
  ``PBKDF2-HMAC-SHA256(password, salt.encode("utf-8"), iterations)``, which is exactly SCRAM's
  ``SaltedPassword``; ``StoredKey`` and ``ServerKey`` follow from it.
- An unknown account is never told apart: it is offered stable fake credentials (the same salt
  for the same name, the real iteration count) and fails only at the end, with the same
  ``authentication failed`` as a wrong password. scramp's ``e=unknown-user`` is never used.
- Every failure raises one :class:`ScramError`; messages are size-capped before parsing; the
  caller (a door) answers every failure with one generic refusal.
- RFC 7677 asks for at least 4096 iterations, and scramp enforces it (and 12-byte salts):
  a stored hash below that cannot be used for SCRAM and is treated like an unknown account
  (CLEAR logins still work for it). An authzid (``a=``) is refused, as scramp does.

Passwords: Django hashes a password exactly as given; scramp's client applies SASLprep. They
agree for every password SASLprep leaves unchanged (all printable ASCII, most text in NFKC).

Nothing here does any I/O; the caller carries the messages (profile §5: base64 on
``200 + <data>`` lines).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import scramp

__all__ = [
    "AUTH_FAILED",
    "DEFAULT_DUMMY_ITERATIONS",
    "MAX_MESSAGE_BYTES",
    "MIN_ITERATIONS",
    "TLS_SERVER_END_POINT",
    "ScramClient",
    "ScramCredentials",
    "ScramError",
    "ScramServer",
    "django_default_iterations",
    "dummy_credentials",
    "password_verifier",
]

#: The one channel binding type offered (SCRAM-SHA-256-PLUS on SMQPS).
TLS_SERVER_END_POINT = "tls-server-end-point"

#: The one error text for a wrong password and for an unknown account alike (profile §5).
AUTH_FAILED = "authentication failed"

#: Longest SCRAM message accepted, in bytes (far above any legitimate message).
MAX_MESSAGE_BYTES = 4096

#: RFC 7677 §4's minimum, which scramp enforces on both sides.
MIN_ITERATIONS = 4096

#: Iteration count of the fake credentials of unknown accounts, unless told otherwise. Servers
#: should pass the count new Django hashes get (:func:`django_default_iterations`).
DEFAULT_DUMMY_ITERATIONS = MIN_ITERATIONS

_MECHANISM = "SCRAM-SHA-256"
_MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
_DJANGO_ALGORITHM = "pbkdf2_sha256"
_KEY_LEN = hashlib.sha256().digest_size  # 32
_MIN_SALT = 12  # scramp's minimum salt length
# Django 5.x salts: 22 characters from [a-zA-Z0-9] (128 bits); dummy salts look the same.
_SALT_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_DUMMY_SALT_LEN = 22
_POSIT_NUMBER_RE = re.compile(r"[1-9][0-9]*")
# What scramp's parsers may raise on hostile input besides ScramException.
_PARSE_ERRORS = (scramp.ScramException, ValueError, KeyError, IndexError, TypeError,
                 binascii.Error, UnicodeError)


class ScramError(Exception):
    """A failed SCRAM exchange. The message is safe to show to the peer: never a secret."""


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _to_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _reason(error: BaseException) -> str:
    """scramp's RFC 5802 error code (``channel-bindings-dont-match``, ``other-error``...) and
    its explanation as the ScramError text; a wrong proof is just :data:`AUTH_FAILED`."""
    code = getattr(error, "server_error", None)
    code = getattr(code, "value", code)
    if code == "invalid-proof":
        return AUTH_FAILED
    text = str(error.args[0]) if error.args else ""
    return f"{code or 'malformed message'}: {text}" if text else str(code or "malformed message")


def _decode(message: object) -> str:
    if not isinstance(message, bytes | bytearray):
        raise ScramError("message must be bytes")
    if len(message) > MAX_MESSAGE_BYTES:
        raise ScramError("message too long")
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("invalid-encoding") from None


# --- credentials: the adapter over Django's hashes ----------------------------------------------


@dataclass(frozen=True)
class ScramCredentials:
    """What a SCRAM server needs to know about one account (RFC 5802 §3), in the shape of
    scramp's ``auth_fn`` result. ``stored_key`` and ``server_key`` are secrets (the first
    verifies the client, the second lets its holder pose as the server): not in ``repr``."""

    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def from_salted_password(
        cls, salted_password: bytes, salt: bytes, iterations: int
    ) -> ScramCredentials:
        """Credentials from ``SaltedPassword = Hi(password, salt, iterations)`` (scramp only
        derives them from a password, and Django stores the salted password)."""
        return cls(
            salt=bytes(salt),
            iterations=iterations,
            stored_key=hashlib.sha256(_hmac(salted_password, b"Client Key")).digest(),
            server_key=_hmac(salted_password, b"Server Key"),
        )

    @classmethod
    def from_password(
        cls, password: str | bytes, salt: str | bytes, iterations: int
    ) -> ScramCredentials:
        """Credentials computed from a password as Django would hash it (UTF-8, not
        normalised)."""
        if iterations < 1:
            raise ScramError("iteration count must be positive")
        salt_bytes = _to_bytes(salt)
        salted = hashlib.pbkdf2_hmac(
            "sha256", _to_bytes(password), salt_bytes, iterations, dklen=_KEY_LEN
        )
        return cls.from_salted_password(salted, salt_bytes, iterations)

    @classmethod
    def from_django_hash(cls, encoded: str) -> ScramCredentials:
        """Credentials from a Django ``pbkdf2_sha256$<iterations>$<salt>$<hash>`` string.

        Raises :class:`ScramError` for anything else: unusable passwords (``!...``), other
        algorithms (argon2, bcrypt, pbkdf2_sha1, ...) and malformed hashes. The message never
        quotes the hash.
        """
        if not isinstance(encoded, str):
            raise ScramError("not a pbkdf2_sha256 password hash")
        parts = encoded.split("$")
        if len(parts) != 4 or parts[0] != _DJANGO_ALGORITHM:
            raise ScramError("not a pbkdf2_sha256 password hash")
        _, iterations_text, salt, hash_b64 = parts
        if not _POSIT_NUMBER_RE.fullmatch(iterations_text) or not salt:
            raise ScramError("malformed pbkdf2_sha256 password hash")
        try:
            salted = base64.b64decode(hash_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ScramError("malformed pbkdf2_sha256 password hash") from None
        if len(salted) != _KEY_LEN:
            raise ScramError("malformed pbkdf2_sha256 password hash")
        return cls.from_salted_password(salted, salt.encode("utf-8"), int(iterations_text))

    @property
    def usable(self) -> bool:
        """Whether scramp (RFC 7677) accepts these: at least 4096 iterations, 12-byte salt."""
        return self.iterations >= MIN_ITERATIONS and len(self.salt) >= _MIN_SALT


def dummy_credentials(
    username: str, secret: bytes, iterations: int = DEFAULT_DUMMY_ITERATIONS
) -> ScramCredentials:
    """Deterministic fake credentials for an account that does not exist.

    The salt is derived from ``HMAC(secret, username)`` and shaped like a Django salt, so the
    same unknown name is always offered the same salt, as a real account would be, and the
    exchange only fails at the end, with the same error as a wrong password (profile §5).
    ``secret`` must stay the same across restarts and processes (e.g. derived from
    ``SECRET_KEY``), and ``iterations`` should be the count real hashes get.
    """
    name = _to_bytes(username)
    number = int.from_bytes(_hmac(secret, b"scram-dummy-salt\x00" + name), "big")
    chars = []
    for _ in range(_DUMMY_SALT_LEN):
        number, index = divmod(number, len(_SALT_ALPHABET))
        chars.append(_SALT_ALPHABET[index])
    salted = _hmac(secret, b"scram-dummy-key\x00" + name)
    return ScramCredentials.from_salted_password(
        salted, "".join(chars).encode("ascii"), max(iterations, MIN_ITERATIONS))


def django_default_iterations() -> int:
    """Iteration count Django gives new ``pbkdf2_sha256`` hashes (needs Django settings): the
    count of the first ``pbkdf2_sha256`` hasher in ``PASSWORD_HASHERS`` (the one
    ``make_password`` uses). Django is imported lazily, here only."""
    from django.contrib.auth.hashers import get_hashers

    for hasher in get_hashers():
        if hasher.algorithm == _DJANGO_ALGORITHM:
            return int(hasher.iterations)
    raise ScramError("no pbkdf2_sha256 password hasher configured")


# --- server -----------------------------------------------------------------------------------


class ScramServer:
    """Server side of one SCRAM-SHA-256 exchange, without I/O.

    Feed each client message to :meth:`step` and send back what it returns: client-first gives
    server-first, client-final gives server-final (``v=...``). Any failure raises
    :class:`ScramError` and ends the exchange; a wrong proof raises
    ``ScramError("authentication failed")`` whether or not the account exists.

    ``lookup(username)`` maps the (unescaped) name to credentials; returning ``None`` or raising
    :class:`ScramError` (an unusable or non-PBKDF2 hash) means "no such account", which is then
    run with :func:`dummy_credentials` and fails only at the final step. Other exceptions from
    ``lookup`` (database errors) propagate. ``dummy_key`` folds names the way ``lookup`` does.

    ``channel_binding`` is ``(type, data)`` when the connection has one: on TLS
    ``("tls-server-end-point", <the server certificate, PEM str>)`` (scramp hashes it), or the
    binding data itself as bytes. A client may then bind with ``p=<type>``, and ``y`` fails as
    a downgrade (RFC 5802 §6). ``require_binding`` (SCRAM-SHA-256-PLUS) accepts only
    ``p=<type>``. Without ``channel_binding`` only ``n`` and ``y`` are accepted.

    After the exchange, ``authenticated`` is true on success and ``username`` holds the name
    as the client gave it (``=2C``/``=3D`` decoded).
    """

    def __init__(
        self,
        lookup: Callable[[str], ScramCredentials | None],
        *,
        dummy_secret: bytes,
        nonce_factory: Callable[[], str] | None = None,
        dummy_iterations: int = DEFAULT_DUMMY_ITERATIONS,
        dummy_key: Callable[[str], str] | None = None,
        channel_binding: tuple[str, bytes | str] | None = None,
        require_binding: bool = False,
    ) -> None:
        if require_binding and channel_binding is None:
            raise ValueError("require_binding needs channel_binding")
        self._lookup = lookup
        self._dummy_secret = dummy_secret
        self._dummy_iterations = dummy_iterations
        self._dummy_key = dummy_key
        self._known = False
        self._lookup_error: BaseException | None = None
        self._state = "initial"
        self.username: str | None = None
        self.authenticated: bool = False
        mechanism = scramp.ScramMechanism(_MECHANISM_PLUS if require_binding else _MECHANISM)
        try:
            self._server = mechanism.make_server(
                self._auth, channel_binding=channel_binding,
                s_nonce=nonce_factory() if nonce_factory else secrets.token_urlsafe(24))
        except scramp.ScramException as error:
            raise ValueError(f"bad SCRAM server set-up: {error}") from None

    @property
    def finished(self) -> bool:
        """True once the exchange has succeeded or failed."""
        return self._state in ("done", "failed")

    def _auth(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn``: never reports an unknown user, offers fake credentials."""
        self.username = username
        try:
            credentials = self._lookup(username)
        except ScramError:
            credentials = None
        except Exception as error:  # the store's failure, not the peer's: re-raised in step()
            self._lookup_error = error
            raise
        self._known = credentials is not None and credentials.usable
        if not self._known:
            key = self._dummy_key(username) if self._dummy_key else username
            credentials = dummy_credentials(key, self._dummy_secret, self._dummy_iterations)
        assert credentials is not None
        return credentials.salt, credentials.stored_key, credentials.server_key, \
            credentials.iterations

    def step(self, client_message: bytes) -> bytes:
        """Process the next client message and return the server's reply.

        Raises :class:`ScramError` (and only that, but for a failing ``lookup``) on any
        malformed or wrong message, or when called after the exchange has finished.
        """
        state = self._state
        if state in ("done", "failed"):
            raise ScramError("exchange already finished")
        self._state = "failed"  # until this step succeeds
        text = _decode(client_message)
        try:
            if state == "initial":
                self._server.set_client_first(text)
                reply = self._server.get_server_first()
            else:
                self._server.set_client_final(text)
                reply = self._server.get_server_final()
        except _PARSE_ERRORS as error:
            if self._lookup_error is not None:
                raise self._lookup_error from None
            raise ScramError(_reason(error)) from None
        if state == "initial":
            self._state = "first"
        else:
            if not self._known:
                raise ScramError(AUTH_FAILED)
            self._state = "done"
            self.authenticated = True
        return reply.encode("utf-8")


# --- client -----------------------------------------------------------------------------------


class ScramClient:
    """Client side of one SCRAM-SHA-256 exchange over scramp (tests, benchmarks, CLI, links).

    ``first()`` gives client-first, ``final(server_first)`` gives client-final, and
    ``verify(server_final)`` checks the server's signature. ``channel_binding`` is
    ``(type, data)``: the binding data as bytes, or the ``ssl.SSLSocket``/``SSLObject`` of the
    connection (scramp hashes the server's certificate), for SCRAM-SHA-256-PLUS.
    """

    def __init__(
        self,
        username: str,
        password: str,
        nonce: str | None = None,
        *,
        channel_binding: tuple[str, object] | None = None,
    ) -> None:
        mechanism = _MECHANISM_PLUS if channel_binding else _MECHANISM
        try:
            self._client = scramp.ScramClient(
                [mechanism], username, password, channel_binding=channel_binding,
                c_nonce=nonce)
        except _PARSE_ERRORS as error:
            raise ScramError(f"cannot start SCRAM: {error}") from None
        self.username = username

    def _call(self, method: Callable[..., str | None], *args: str) -> str | None:
        try:
            return method(*args)
        except _PARSE_ERRORS as error:
            raise ScramError(str(error)) from None

    def first(self) -> bytes:
        """The client-first message."""
        return (self._call(self._client.get_client_first) or "").encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        """The client-final message answering ``server_first``."""
        self._call(self._client.set_server_first, _decode(server_first))
        return (self._call(self._client.get_client_final) or "").encode("utf-8")

    def verify(self, server_final: bytes) -> None:
        """Check server-final; raise :class:`ScramError` unless the server proved itself."""
        self._call(self._client.set_server_final, _decode(server_final))


def password_verifier(password: str, iterations: int, salt: str | None = None) -> bytes:
    """The new-password line of ``SET LOGIN PASSWORD SCRAM-SHA-256/1.0`` (client side):
    ``s=<salt>,i=<iterations>,p=<base64 SaltedPassword>``, so the server stores the new
    password's PBKDF2 hash without ever seeing the password."""
    if salt is None:
        salt = "".join(secrets.choice(_SALT_ALPHABET) for _ in range(_DUMMY_SALT_LEN))
    salted = hashlib.pbkdf2_hmac("sha256", _to_bytes(password), salt.encode("ascii"),
                                 iterations, dklen=_KEY_LEN)
    return f"s={salt},i={iterations},p={base64.b64encode(salted).decode('ascii')}".encode()
