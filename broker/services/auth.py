"""Login: password checks, logged-in sessions, and the throttling of repeated failures.

Profile §5: LOGIN never tells whether an account exists; PASS answers 401 alike for an unknown
account and a wrong password. Attempts are counted per (peer address, account) and per account (in
the shared cache, so every process and door sees them), before the password is checked: past a
first threshold each further attempt is slowed down, past a second one it is refused for a
while; a good login clears only its own account's counts.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ipaddress
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.hashers import check_password, make_password
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from accounts import scram
from accounts.models import Account, LoginSession

from . import events

logger = logging.getLogger("broker.services.auth")

SUPPORTED_METHODS = ("CLEAR", "SCRAM-SHA-256")
# Offered on TLS only: the exchange is bound to the server's certificate (profile §9.4).
TLS_METHODS = (*SUPPORTED_METHODS, "SCRAM-SHA-256-PLUS")

# A valid hash of a random password, checked when the account does not exist so that an
# unknown account costs the same time as a wrong password (no enumeration by timing).
_DUMMY_HASH: str | None = None


def _dummy_hash() -> str:
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = make_password(None)
    return _DUMMY_HASH


def clear_allowed(tls: bool, peer_host: str) -> bool:
    """May a CLEAR login (a password in the clear) be made on this connection? Always on TLS;
    on plain TCP as ``SMQP_CLEAR_ON_PLAIN`` says (profile §9.4): ``loopback`` allows only a
    peer on this machine's loopback (127.0.0.0/8, ::1), where no network is crossed."""
    if tls:
        return True
    policy = settings.SMQP_CLEAR_ON_PLAIN
    if policy != "loopback":
        return policy == "yes"
    try:
        address = ipaddress.ip_address(peer_host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket's ::ffff:127.0.0.1
    return address.is_loopback


def find_account(username: str) -> Account | None:
    try:
        return Account.objects.get(username_key=username.casefold(), is_active=True)
    except Account.DoesNotExist:
        return None


def check_clear_password(username: str, password: str) -> Account | None:
    """The account if ``password`` is right, else None (same work either way)."""
    account = find_account(username)
    if account is None:
        check_password(password, _dummy_hash())
        return None
    if account.check_password(password):
        return account
    return None


@functools.lru_cache(maxsize=4)
def _certificate_pem(server_cert: bytes) -> str:
    """scramp computes the ``tls-server-end-point`` hash itself, from the PEM form."""
    return ssl.DER_cert_to_PEM_cert(server_cert)


def scram_server(server_cert: bytes | None = None, *, plus: bool = False) -> scram.ScramServer:
    """A SCRAM-SHA-256 exchange served from the stored PBKDF2-SHA256 hashes. Unknown accounts
    get stable fake credentials with the real iteration count and case folding, so the
    exchange looks the same for them up to the final failure (no enumeration).

    On TLS ``server_cert`` is the certificate the connection presented (DER): the client may
    bind to it (``tls-server-end-point``), and must with ``plus`` (SCRAM-SHA-256-PLUS)."""

    def lookup(username: str) -> scram.ScramCredentials | None:
        account = find_account(username)
        return scram.ScramCredentials.from_django_hash(account.password) if account else None

    dummy_secret = hashlib.sha256(b"smqp-scram-dummy:" + settings.SECRET_KEY.encode()).digest()
    return scram.ScramServer(
        lookup,
        dummy_secret=dummy_secret,
        dummy_iterations=scram.django_default_iterations(),
        dummy_key=str.casefold,
        channel_binding=(
            (scram.TLS_SERVER_END_POINT, _certificate_pem(server_cert)) if server_cert else None),
        require_binding=plus,
    )


# --- throttling -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throttle:
    refused: bool
    delay: float
    # Over the limit only while other attempts of the same pair are still being checked:
    # their outcome may clear the count (a good login), so the door waits and asks again.
    busy: bool = False


# Bearer tokens name no account: guesses of them from one address share this pseudo-account.
TOKEN_GUESSES = "(token)"


def _pair_key(peer_host: str, username: str) -> str:
    return f"login-failures:{peer_host}:{username.casefold()}"


def _account_key(username: str) -> str:
    return f"login-failures-account:{username.casefold()}"


def _inflight_key(peer_host: str, username: str) -> str:
    return f"login-inflight:{peer_host}:{username.casefold()}"


# Take one off each key that exists, never below 0, keeping its expiry: in one round trip,
# atomic against the other processes' counts (a DECR alone would bring an expired key back).
_UNCOUNT = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 and redis.call('DECR', key) < 0 then
    redis.call('SET', key, 0, 'KEEPTTL')
  end
end
"""


def _uncount(*keys: str) -> None:
    """Take one off each of ``keys`` (never below 0); nothing for one that expired."""
    client = cache._cache.get_client(write=True)
    client.eval(_UNCOUNT, len(keys), *(cache.make_and_validate_key(key) for key in keys))


def _count(*keys: str) -> list[int]:
    """Add one to each of ``keys`` in one MULTI/EXEC (atomic against every other process's
    counts, and one round trip), each kept for the lockout period from now on; their new
    values. Django's cache API has no atomic increment of several keys: this uses its Redis
    client and key names directly (the values are plain integers, as ``cache.incr`` keeps)."""
    timeout = settings.SMQP_LOGIN_LOCKOUT_SECONDS
    pipe = cache._cache.get_client(write=True).pipeline(transaction=True)
    for key in keys:
        name = cache.make_and_validate_key(key)
        pipe.incr(name)
        pipe.expire(name, timeout)
    return pipe.execute()[::2]


def _throttle(pair_failures: int, account_failures: int,
              decided: int | None = None) -> Throttle:
    """How to treat an attempt preceded by these failure counts. The refusal counts every
    attempt no good login has cleared, those still being checked included, so parallel
    guesses stay bounded; the delay counts only the failures already ``decided`` (default:
    all of them), so a burst of good logins (workers reconnecting at once) is not slowed
    down as guessing is."""
    if (pair_failures >= settings.SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT
            or account_failures >= settings.SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT):
        return Throttle(refused=True, delay=0.0)
    failed = pair_failures if decided is None else decided
    excess = failed - settings.SMQP_LOGIN_FAILURES_BEFORE_DELAY
    if excess >= 0:
        return Throttle(refused=False, delay=min(0.5 * 2**excess, 8.0))
    return Throttle(refused=False, delay=0.0)


def count_attempt(peer_host: str, username: str) -> Throttle:
    """Count a login attempt for ``username`` from ``peer_host`` *before* its password is
    checked, and say how to treat it. Counting first (an atomic increment) means parallel
    attempts cannot all read the same old count: the eleventh of sixteen simultaneous guesses
    is refused. An attempt is a failure until :func:`record_success` clears it.

    Two counts: per (address, account), which slows down and then refuses one guesser; and
    per account from every address (a higher limit, ``SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_
    LOCKOUT``), which bounds guessing spread over many addresses. The attempt joins its
    pair's in-flight count in the same MULTI, so the pair's count less the in-flight one is
    exactly the failures already decided, which alone set the delay."""
    pair_key, account_key = _pair_key(peer_host, username), _account_key(username)
    inflight_key = _inflight_key(peer_host, username)
    inflight, pair, account = _count(inflight_key, pair_key, account_key)
    throttle = _throttle(pair - 1, account - 1, decided=max(pair - inflight, 0))
    if not throttle.refused:
        return throttle
    if inflight > 1:
        # Attempts of this pair are being checked: a burst of good logins of one account
        # (workers reconnecting) must not refuse itself. This one gives its counts back and
        # waits (admit_attempt); parallel guesses stay bounded by the limit.
        _uncount(inflight_key, pair_key, account_key)
        return Throttle(refused=True, delay=0.0, busy=True)
    _uncount(inflight_key)  # refused: it is checked no further
    return throttle


# How long an attempt over the limit waits for the attempts of its pair still being checked.
ADMIT_WAIT_SECONDS = 10.0
ADMIT_POLL_SECONDS = 0.05


# The counts are in Redis only: they are taken on threads of their own, not on the listener's
# database thread, where a crowd of attempts waiting (polling) for their pair's outcome would
# queue every other account's database work behind their round trips.
_COUNTING = ThreadPoolExecutor(max_workers=2, thread_name_prefix="smqp-throttle")


async def admit_attempt(peer_host: str, username: str) -> Throttle:
    """:func:`count_attempt` from a door's event loop, waiting while it is only busy."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + ADMIT_WAIT_SECONDS
    while True:
        throttle = await loop.run_in_executor(_COUNTING, count_attempt, peer_host, username)
        if not throttle.busy:
            return throttle
        if time.monotonic() >= deadline:
            return Throttle(refused=True, delay=0.0)
        await asyncio.sleep(ADMIT_POLL_SECONDS)


def admit_attempt_blocking(peer_host: str, username: str) -> Throttle:
    """:func:`admit_attempt` for a synchronous door (a REST view in its worker thread)."""
    deadline = time.monotonic() + ADMIT_WAIT_SECONDS
    while True:
        throttle = count_attempt(peer_host, username)
        if not throttle.busy:
            return throttle
        if time.monotonic() >= deadline:
            return Throttle(refused=True, delay=0.0)
        time.sleep(ADMIT_POLL_SECONDS)


def token_throttle(peer_host: str) -> Throttle:
    """How to treat a bearer token from ``peer_host`` (read only: checking a token is a
    lookup, not a password hash, and every API request carries one)."""
    failures = cache.get(_pair_key(peer_host, TOKEN_GUESSES), 0)
    return _throttle(failures, 0)


def record_token_failure(peer_host: str, token_prefix: str) -> None:
    [failures] = _count(_pair_key(peer_host, TOKEN_GUESSES))
    events.record("login_failed", account=f"token {token_prefix}"[:64], peer=peer_host,
                  failures=failures)


def record_failure(peer_host: str, username: str) -> None:
    """A failed attempt (already counted by :func:`count_attempt`): the audit event."""
    _uncount(_inflight_key(peer_host, username))
    failures = cache.get(_pair_key(peer_host, username), 0)
    events.record(
        "login_failed", account=username[:64], peer=peer_host, failures=failures
    )


def record_undecided(peer_host: str, username: str) -> None:
    """An admitted attempt whose check could not be made (the database away in a failover):
    it decided nothing and told the client nothing of the password, so its counts are given
    back. Counted as a failure, every client reconnecting through an outage (all from the
    load balancer's address) would lock its account out for when the database is back.
    Never raises: the caller has the check's own error to report."""
    try:
        _uncount(_inflight_key(peer_host, username), _pair_key(peer_host, username),
                 _account_key(username))
    except Exception:  # Redis away too: the attempt's counts expire in time
        logger.warning("login attempt of %s not given back", username, exc_info=True)


async def give_back_attempt(peer_host: str, username: str) -> None:
    """:func:`record_undecided` from a door's event loop (on the counting threads: the
    database thread may be stuck on the outage that made the check fail)."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_COUNTING, record_undecided, peer_host, username)


def record_success(peer_host: str, username: str) -> None:
    """A good login clears its own account's counts and nobody else's (another account's
    good login from the same address does not give a guesser more tries)."""
    _uncount(_inflight_key(peer_host, username))
    cache.delete_many([_pair_key(peer_host, username), _account_key(username)])


# --- sessions -------------------------------------------------------------------------------


@transaction.atomic
def begin_session(account: Account, *, peer: str, method: str) -> LoginSession:
    """Record a new logged-in instance of ``account``; its guid is the account name and a
    number unique on this server (``jtegen0456``)."""
    session = LoginSession.objects.create(
        account=account,
        auth_method=method,
        peer_address=peer,
        server_context=settings.SMQP_SERVER_CONTEXT,
    )
    session.guid = f"{account.username}{session.pk:04d}"
    session.save(update_fields=["guid"])
    Account.objects.filter(pk=account.pk).update(last_login=timezone.now())
    events.record("login", account=account.username, peer=peer, guid=session.guid, method=method)
    return session


def end_session(session: LoginSession) -> None:
    ended = timezone.now()
    LoginSession.objects.filter(pk=session.pk, ended__isnull=True).update(ended=ended)
    events.record("logout", account=session.account.username, guid=session.guid or "")



def xmpp_plain_allowed(tls: bool, peer_host: str) -> bool:
    """May SASL PLAIN be offered on this XMPP stream (XMPP-PROFILE §2)? Over ``wss://``
    always; else as ``SMQP_XMPP_PLAIN`` says: ``loopback`` only to a peer on this machine's
    loopback, ``yes`` to anyone, ``no`` never."""
    if tls:
        return True
    policy = settings.SMQP_XMPP_PLAIN
    if policy != "loopback":
        return policy == "yes"
    try:
        address = ipaddress.ip_address(peer_host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
