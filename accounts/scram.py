"""SCRAM-SHA-256 and SCRAM-SHA-256-PLUS (RFC 5802, RFC 7677; channel binding
``tls-server-end-point``, RFC 5929) as a pure, sans-IO state machine.

The server side works straight from the PBKDF2-SHA256 hashes Django already stores, so no
plaintext password and no extra per-account secret is kept. A Django hash

    pbkdf2_sha256$<iterations>$<salt>$<base64 hash>

stores ``base64(PBKDF2-HMAC-SHA256(password, salt.encode("utf-8"), iterations, dklen=32))``,
which is exactly SCRAM's ``SaltedPassword = Hi(password, salt, i)`` when the SCRAM salt is
``salt.encode("utf-8")`` (sent base64-encoded as ``s=`` in server-first). ``ClientKey``,
``StoredKey`` and ``ServerKey`` all follow from it.

Password normalisation: RFC 5802 asks for SASLprep, but Django hashes the password exactly as
it was given (UTF-8 encoded, no normalisation), and the server can only match what Django
hashed. So neither side here normalises anything: the SCRAM client must use the password
exactly as Django received it when it was set, UTF-8 encoded. Usernames are not normalised
either; the ``lookup`` callable given to :class:`ScramServer` decides how names map to accounts.

Nothing here does any I/O; the caller carries the messages (profile §5: base64 on
``200 + <data>`` lines) and decides what to do with a :class:`ScramError`.

Typical server use::

    server = ScramServer(lookup, dummy_secret=key, dummy_iterations=django_default_iterations())
    server_first = server.step(client_first)
    server_final = server.step(client_final)  # raises ScramError("authentication failed")
    assert server.authenticated
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

__all__ = [
    "AUTH_FAILED",
    "DEFAULT_DUMMY_ITERATIONS",
    "MAX_MESSAGE_BYTES",
    "ScramClient",
    "ScramCredentials",
    "ScramError",
    "ScramServer",
    "django_default_iterations",
    "dummy_credentials",
    "tls_server_end_point",
]

#: The one channel binding type offered (SCRAM-SHA-256-PLUS on SMQPS).
TLS_SERVER_END_POINT = "tls-server-end-point"

#: The one error text for a wrong password and for an unknown account alike (profile §5).
AUTH_FAILED = "authentication failed"

#: Longest SCRAM message accepted, in bytes (far above any legitimate message).
MAX_MESSAGE_BYTES = 4096

#: Iteration count of the fake credentials of unknown accounts, unless told otherwise. Servers
#: should pass the count new Django hashes get (:func:`django_default_iterations`) so unknown
#: accounts cannot be told apart by the ``i=`` they are offered.
DEFAULT_DUMMY_ITERATIONS = 4096

#: Clients refuse to run PBKDF2 with more iterations than this (a hostile server's DoS).
DEFAULT_MAX_CLIENT_ITERATIONS = 10_000_000

_DJANGO_ALGORITHM = "pbkdf2_sha256"
_KEY_LEN = hashlib.sha256().digest_size  # 32
# Django 5.x salts: 22 characters from [a-zA-Z0-9] (128 bits); dummy salts look the same.
_SALT_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_DUMMY_SALT_LEN = 22

# RFC 5802 §7 grammar pieces (applied with fullmatch to already-split attribute values).
_SASLNAME_RE = re.compile(r"(?:[^\x00,=]|=2C|=3D)+")
_PRINTABLE_RE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_BASE64_RE = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_POSIT_NUMBER_RE = re.compile(r"[1-9][0-9]*")
_EXTENSION_RE = re.compile(r"[A-Za-z]=[^\x00,]+")
_CB_NAME_RE = re.compile(r"[A-Za-z0-9.-]+")
_VALUE_RE = re.compile(r"[^\x00,]+")


class ScramError(Exception):
    """A failed SCRAM exchange. The message is safe to show to the peer: never a secret."""


# --- primitives -------------------------------------------------------------------------------


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: str, what: str) -> bytes:
    """Strict, canonical base64 (RFC 5802 grammar) to bytes, or ScramError."""
    if not _BASE64_RE.fullmatch(value):
        raise ScramError(f"malformed {what}")
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError(f"malformed {what}") from None
    if base64.b64encode(decoded).decode("ascii") != value:  # non-zero padding bits
        raise ScramError(f"malformed {what}")
    return decoded


def _to_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _escape_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape_saslname(value: str, what: str) -> str:
    if not _SASLNAME_RE.fullmatch(value):
        raise ScramError(f"malformed {what}")
    return value.replace("=2C", ",").replace("=3D", "=")


def _decode_message(message: bytes, what: str) -> str:
    if not isinstance(message, bytes | bytearray | memoryview):
        raise ScramError(f"malformed {what}")
    if len(message) > MAX_MESSAGE_BYTES:
        raise ScramError(f"{what} too long")
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError(f"malformed {what}") from None


def _attr(part: str, name: str, what: str) -> str:
    """The value of ``name=value``, or ScramError."""
    if len(part) < 2 or part[0] != name or part[1] != "=":
        raise ScramError(f"malformed {what}")
    return part[2:]


def _check_extensions(parts: list[str], what: str) -> None:
    for part in parts:
        if part.startswith("m="):
            raise ScramError("mandatory extensions not supported")
        if not _EXTENSION_RE.fullmatch(part):
            raise ScramError(f"malformed {what}")


# --- credentials ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScramCredentials:
    """What a SCRAM server needs to know about one account (RFC 5802 §3).

    ``stored_key`` and ``server_key`` are secrets (the first verifies the client, the second
    lets its holder pose as the server), so they are left out of ``repr``.
    """

    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def from_salted_password(
        cls, salted_password: bytes, salt: bytes, iterations: int
    ) -> ScramCredentials:
        """Credentials from ``SaltedPassword = Hi(password, salt, iterations)``."""
        client_key = _hmac(salted_password, b"Client Key")
        return cls(
            salt=bytes(salt),
            iterations=iterations,
            stored_key=_h(client_key),
            server_key=_hmac(salted_password, b"Server Key"),
        )

    @classmethod
    def from_password(
        cls, password: str | bytes, salt: str | bytes, iterations: int
    ) -> ScramCredentials:
        """Credentials computed from a password (UTF-8 encoded, not normalised)."""
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


def dummy_credentials(
    username: str, secret: bytes, iterations: int = DEFAULT_DUMMY_ITERATIONS
) -> ScramCredentials:
    """Deterministic fake credentials for an account that does not exist.

    The salt is derived from ``HMAC(secret, username)`` and shaped like a Django salt, so the
    same unknown name is always offered the same salt, as a real account would be, and the
    exchange only fails at the end, with the same error as a wrong password (profile §5).
    The keys are derived from the secret too; no password can match them. ``secret`` must stay
    the same across restarts and processes (e.g. derived from ``SECRET_KEY``), and
    ``iterations`` should be the count real hashes get.
    """
    name = _to_bytes(username)
    number = int.from_bytes(_hmac(secret, b"scram-dummy-salt\x00" + name), "big")
    chars = []
    for _ in range(_DUMMY_SALT_LEN):
        number, index = divmod(number, len(_SALT_ALPHABET))
        chars.append(_SALT_ALPHABET[index])
    salted = _hmac(secret, b"scram-dummy-key\x00" + name)
    return ScramCredentials.from_salted_password(salted, "".join(chars).encode("ascii"), iterations)


def tls_server_end_point(certificate_der: bytes) -> bytes:
    """The ``tls-server-end-point`` channel binding data of a server certificate (RFC 5929
    §4.1): its hash with the certificate's signature hash, SHA-256 when that is MD5 or
    SHA-1 (or none)."""
    from cryptography import x509

    algorithm = x509.load_der_x509_certificate(certificate_der).signature_hash_algorithm
    name = algorithm.name if algorithm is not None else "sha256"
    if name in ("md5", "sha1"):
        name = "sha256"
    return hashlib.new(name, certificate_der).digest()


def django_default_iterations() -> int:
    """Iteration count Django gives new ``pbkdf2_sha256`` hashes (needs Django settings).

    Meant for ``ScramServer(dummy_iterations=...)``. This is the count of the first
    ``pbkdf2_sha256`` hasher in ``PASSWORD_HASHERS`` (the one ``make_password`` uses), not
    ``get_hasher("pbkdf2_sha256")``, which returns the *last* hasher of that algorithm (here
    Django's stock one, not the project's configurable subclass). Django is imported lazily,
    here only.
    """
    from django.contrib.auth.hashers import get_hashers

    for hasher in get_hashers():
        if hasher.algorithm == _DJANGO_ALGORITHM:
            return int(hasher.iterations)
    raise ScramError("no pbkdf2_sha256 password hasher configured")


def _default_nonce() -> str:
    return secrets.token_urlsafe(24)


# --- server -----------------------------------------------------------------------------------


class ScramServer:
    """Server side of one SCRAM-SHA-256 exchange, without I/O.

    Feed each client message to :meth:`step` and send back what it returns: client-first gives
    server-first, client-final gives server-final (``v=...``). Any failure raises
    :class:`ScramError` and ends the exchange; a wrong proof raises
    ``ScramError("authentication failed")`` whether or not the account exists.

    ``lookup(username)`` maps the (unescaped) name to credentials; returning ``None`` or raising
    :class:`ScramError` (e.g. from :meth:`ScramCredentials.from_django_hash` on an unusable or
    non-PBKDF2 hash) means "no such account", which is then run with
    :func:`dummy_credentials` and fails only at the final step. Other exceptions from
    ``lookup`` (say, database errors) propagate.

    ``dummy_key`` maps the name to the key of the fake credentials; it must fold names the way
    ``lookup`` does (e.g. ``str.casefold`` for case-insensitive accounts), otherwise an unknown
    ``"BOB"`` and ``"bob"`` get different salts while a real account's would be the same.

    ``channel_binding`` is ``(type, data)`` when the connection has one (TLS:
    ``("tls-server-end-point", tls_server_end_point(cert))``): a client may then bind with
    ``p=<type>``, and ``y`` (the client thinks the server cannot bind) fails as a downgrade
    (RFC 5802 §6). ``require_binding`` (SCRAM-SHA-256-PLUS) accepts only ``p=<type>``.
    Without ``channel_binding`` only ``n`` and ``y`` are accepted. An authzid (``a=``) is
    accepted only when it equals the username.

    After the exchange, ``authenticated`` is true on success and ``username`` holds the name
    as the client gave it (``=2C``/``=3D`` decoded). ``username`` is set as soon as client-first
    is parsed, but means nothing unless ``authenticated``.
    """

    def __init__(
        self,
        lookup: Callable[[str], ScramCredentials | None],
        *,
        dummy_secret: bytes,
        nonce_factory: Callable[[], str] | None = None,
        dummy_iterations: int = DEFAULT_DUMMY_ITERATIONS,
        dummy_key: Callable[[str], str] | None = None,
        channel_binding: tuple[str, bytes] | None = None,
        require_binding: bool = False,
    ) -> None:
        if require_binding and channel_binding is None:
            raise ValueError("require_binding needs channel_binding")
        self._binding = channel_binding
        self._require_binding = require_binding
        self._lookup = lookup
        self._dummy_secret = dummy_secret
        self._nonce_factory = nonce_factory or _default_nonce
        self._dummy_iterations = dummy_iterations
        self._dummy_key = dummy_key
        self._state = "initial"
        self._credentials: ScramCredentials | None = None
        self._known = False
        self._gs2_header = b""
        self._cbind_input = b""
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self.username: str | None = None
        self.authenticated: bool = False

    @property
    def finished(self) -> bool:
        """True once the exchange has succeeded or failed."""
        return self._state in ("done", "failed")

    def step(self, client_message: bytes) -> bytes:
        """Process the next client message and return the server's reply.

        Raises :class:`ScramError` (and only that) on any malformed or wrong message, or when
        called after the exchange has finished.
        """
        state = self._state
        if state in ("done", "failed"):
            raise ScramError("exchange already finished")
        self._state = "failed"  # until this step succeeds
        if state == "initial":
            reply = self._client_first(client_message)
            self._state = "first"
        else:
            reply = self._client_final(client_message)
            self._state = "done"
        return reply

    def _client_first(self, message: bytes) -> bytes:
        what = "client-first message"
        text = _decode_message(message, what)
        # gs2-header = gs2-cbind-flag "," [ authzid ] ","
        flag, sep, rest = text.partition(",")
        if not sep:
            raise ScramError(f"malformed {what}")
        binding = self._binding
        if flag.startswith("p="):
            if not _CB_NAME_RE.fullmatch(flag[2:]):
                raise ScramError(f"malformed {what}")
            if binding is None or flag[2:] != binding[0]:
                raise ScramError("channel binding not supported")
        elif flag not in ("n", "y"):
            raise ScramError(f"malformed {what}")
        elif self._require_binding:
            raise ScramError("channel binding required")
        elif flag == "y" and binding is not None:
            # The client could bind but believes this server cannot: a downgrade.
            raise ScramError("channel binding downgrade")
        authzid_part, sep, bare = rest.partition(",")
        if not sep:
            raise ScramError(f"malformed {what}")
        authzid = _unescape_saslname(_attr(authzid_part, "a", what), what) if authzid_part else None
        gs2_header = text[: len(text) - len(bare)]

        parts = bare.split(",")
        if parts[0].startswith("m="):
            raise ScramError("mandatory extensions not supported")
        if len(parts) < 2:
            raise ScramError(f"malformed {what}")
        username = _unescape_saslname(_attr(parts[0], "n", what), what)
        client_nonce = _attr(parts[1], "r", what)
        if not _PRINTABLE_RE.fullmatch(client_nonce):
            raise ScramError(f"malformed {what}")
        _check_extensions(parts[2:], what)
        if authzid is not None and authzid != username:
            raise ScramError("authorization identity must match the username")

        server_nonce = self._nonce_factory()
        if not isinstance(server_nonce, str) or not _PRINTABLE_RE.fullmatch(server_nonce):
            raise ValueError("nonce_factory must return printable ASCII without ','")

        credentials: ScramCredentials | None
        try:
            credentials = self._lookup(username)
        except ScramError:
            credentials = None
        self._known = credentials is not None
        if credentials is None:
            key = self._dummy_key(username) if self._dummy_key else username
            credentials = dummy_credentials(key, self._dummy_secret, self._dummy_iterations)

        self.username = username
        self._credentials = credentials
        self._gs2_header = gs2_header.encode("utf-8")
        self._cbind_input = self._gs2_header + (binding[1] if flag.startswith("p=") else b"")
        self._client_first_bare = bare
        self._nonce = client_nonce + server_nonce
        self._server_first = (
            f"r={self._nonce},s={_b64(credentials.salt)},i={credentials.iterations}"
        )
        return self._server_first.encode("ascii")

    def _client_final(self, message: bytes) -> bytes:
        what = "client-final message"
        text = _decode_message(message, what)
        parts = text.split(",")
        if len(parts) < 3:
            raise ScramError(f"malformed {what}")
        # client-final-message = channel-binding "," nonce ["," extensions] "," proof
        proof_part = parts[-1]
        without_proof = text[: len(text) - len(proof_part) - 1]
        cbind = _unb64(_attr(parts[0], "c", what), what)
        nonce = _attr(parts[1], "r", what)
        if not _PRINTABLE_RE.fullmatch(nonce):
            raise ScramError(f"malformed {what}")
        _check_extensions(parts[2:-1], what)
        proof = _unb64(_attr(proof_part, "p", what), what)

        if not hmac.compare_digest(cbind, self._cbind_input):
            raise ScramError("channel binding mismatch")
        if not hmac.compare_digest(nonce.encode("ascii"), self._nonce.encode("ascii")):
            raise ScramError("nonce mismatch")

        credentials = self._credentials
        assert credentials is not None  # set by _client_first
        auth_message = ",".join(
            (self._client_first_bare, self._server_first, without_proof)
        ).encode("utf-8")
        client_signature = _hmac(credentials.stored_key, auth_message)
        if len(proof) == len(client_signature):
            client_key = _xor(proof, client_signature)
            proof_ok = hmac.compare_digest(_h(client_key), credentials.stored_key)
        else:
            proof_ok = False
        if not (proof_ok and self._known):
            raise ScramError(AUTH_FAILED)
        self.authenticated = True
        server_signature = _hmac(credentials.server_key, auth_message)
        return f"v={_b64(server_signature)}".encode("ascii")


# --- client -----------------------------------------------------------------------------------


class ScramClient:
    """Client side of one SCRAM-SHA-256 exchange, without I/O (tests, benchmarks, CLI).

    ``first()`` gives client-first, ``final(server_first)`` gives client-final, and
    ``verify(server_final)`` checks the server's signature (raises :class:`ScramError` if it is
    wrong or the server reported an error). The password is used as given (UTF-8, no
    normalisation), matching what Django hashed. The gs2 header is ``n,,``, or
    ``p=<type>,,`` with ``channel_binding=(type, data)`` (SCRAM-SHA-256-PLUS).
    """

    def __init__(
        self,
        username: str,
        password: str | bytes,
        nonce: str | None = None,
        *,
        max_iterations: int = DEFAULT_MAX_CLIENT_ITERATIONS,
        channel_binding: tuple[str, bytes] | None = None,
    ) -> None:
        if channel_binding is not None and not _CB_NAME_RE.fullmatch(channel_binding[0]):
            raise ScramError("invalid channel binding type")
        self._gs2_header = f"p={channel_binding[0]},," if channel_binding else "n,,"
        self._cbind_input = self._gs2_header.encode("ascii") + (
            channel_binding[1] if channel_binding else b"")
        if nonce is None:
            nonce = _default_nonce()
        if not _PRINTABLE_RE.fullmatch(nonce):
            raise ScramError("nonce must be printable ASCII without ','")
        if not username or "\x00" in username:
            raise ScramError("invalid username")
        self.username = username
        self._password = _to_bytes(password)
        self._nonce = nonce
        self._max_iterations = max_iterations
        self._client_first_bare = f"n={_escape_saslname(username)},r={nonce}"
        self._state = "initial"
        self._server_signature = b""

    def first(self) -> bytes:
        """The client-first message."""
        if self._state != "initial":
            raise ScramError("client-first already sent")
        self._state = "first"
        return f"{self._gs2_header}{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message answering ``server_first``."""
        if self._state != "first":
            raise ScramError("unexpected server-first message")
        self._state = "failed"
        what = "server-first message"
        text = _decode_message(server_first, what)
        parts = text.split(",")
        if parts[0].startswith("m="):
            raise ScramError("mandatory extensions not supported")
        if len(parts) < 3:
            raise ScramError(f"malformed {what}")
        nonce = _attr(parts[0], "r", what)
        if not _PRINTABLE_RE.fullmatch(nonce):
            raise ScramError(f"malformed {what}")
        salt = _unb64(_attr(parts[1], "s", what), what)
        iterations_text = _attr(parts[2], "i", what)
        if not salt or not _POSIT_NUMBER_RE.fullmatch(iterations_text):
            raise ScramError(f"malformed {what}")
        _check_extensions(parts[3:], what)
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise ScramError("nonce mismatch")
        iterations = int(iterations_text)
        if iterations > self._max_iterations:
            raise ScramError("iteration count too high")

        salted = hashlib.pbkdf2_hmac("sha256", self._password, salt, iterations, dklen=_KEY_LEN)
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c={_b64(self._cbind_input)},r={nonce}"
        auth_message = ",".join((self._client_first_bare, text, without_proof)).encode("utf-8")
        client_signature = _hmac(_h(client_key), auth_message)
        proof = _xor(client_key, client_signature)
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        self._state = "final"
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def verify(self, server_final: bytes) -> None:
        """Check server-final; raise :class:`ScramError` unless the server proved itself."""
        if self._state != "final":
            raise ScramError("unexpected server-final message")
        self._state = "failed"
        what = "server-final message"
        text = _decode_message(server_final, what)
        parts = text.split(",")
        if parts[0].startswith("e="):
            error = parts[0][2:]
            if not _VALUE_RE.fullmatch(error):
                raise ScramError(f"malformed {what}")
            raise ScramError(f"server error: {error}")
        signature = _unb64(_attr(parts[0], "v", what), what)
        _check_extensions(parts[1:], what)
        if not hmac.compare_digest(signature, self._server_signature):
            raise ScramError("server signature mismatch")
        self._state = "done"
