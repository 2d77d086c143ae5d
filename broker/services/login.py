"""Login and password change, once for every door: :class:`LoginFlow` drives the state table
of :mod:`broker.domain.login` over the checks of :mod:`broker.services.auth`.

A door feeds what the client sent (:meth:`LoginFlow.login`, :meth:`~LoginFlow.mechanism`,
:meth:`~LoginFlow.password`, :meth:`~LoginFlow.scram`, :meth:`~LoginFlow.change_password`,
:meth:`~LoginFlow.new_password`, :meth:`~LoginFlow.new_verifier`, :meth:`~LoginFlow.abort`:
synchronous, they only move the table), then, when the flow :attr:`~LoginFlow.checking`,
awaits :meth:`~LoginFlow.verify`, which admits the attempt (the throttle), checks it and returns
what to tell the client (:class:`Challenge`, :class:`LoggedIn`, :class:`Reproved`,
:class:`PasswordChanged`). Every refusal is one :class:`LoginRefused` with a :class:`Reason`;
each door maps the reasons to its wire in one place.

The rules, the same at every door (profile §5):

- An attempt is counted (``admit_attempt``) before any password work; a refused one is checked
  no further. A CLEAR / PLAIN attempt waits the throttle's delay first; a SCRAM one is
  admitted at its client-first: before the exchange when the door named the account already
  (SMQP ``LOGIN``), else once the client-first named it (SASL).
- A failure of an admitted attempt is recorded (``record_failure``: the audit event, and the
  attempt leaves the in-flight count); a success clears its account's counts.
- A SCRAM exchange must name the account its ``LOGIN`` named; an account removed during the
  exchange fails it.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any, Protocol

from channels.db import database_sync_to_async

from accounts.models import Account
from accounts.scram import ScramError
from broker.domain import login as table
from broker.domain.login import State
from broker.store import dbthread

from . import accounts as account_service
from . import auth

__all__ = [
    "AuthChecks",
    "Challenge",
    "Checks",
    "LoggedIn",
    "LoginFlow",
    "LoginRefused",
    "PasswordChanged",
    "Reason",
    "Reproved",
]


class Reason(enum.Enum):
    ALREADY_LOGGED_IN = "already logged in"
    OUT_OF_ORDER = "no such step expected now"
    METHOD = "authentication method not offered"
    CLEAR_ON_PLAIN = "a password in the clear on an unencrypted connection"
    OTHER_ACCOUNT = "PASS names another account than LOGIN"
    THROTTLED = "too many failed logins"
    UNAUTHORIZED = "wrong password, unknown account or failed exchange"


class LoginRefused(Exception):
    """A login step refused. ``data`` is a SCRAM server message computed before the refusal
    (the server-final of an exchange whose account was removed meanwhile), which the SMQP
    door still writes."""

    def __init__(self, reason: Reason, data: bytes | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.data = data


@dataclass(frozen=True)
class Challenge:
    """The SCRAM server-first: send it and wait for the client-final."""

    data: bytes


@dataclass(frozen=True)
class LoggedIn:
    account: Account
    method: str  # as the session records it: ``CLEAR/1.0``, ``SCRAM-SHA-256``...
    final: bytes | None  # SCRAM's server-final, None for CLEAR / PLAIN


@dataclass(frozen=True)
class Reproved:
    """The old password was proved by SCRAM (its server-final here): the new verifier next."""

    final: bytes


@dataclass(frozen=True)
class PasswordChanged:
    pass


Outcome = Challenge | LoggedIn | Reproved | PasswordChanged


class ScramExchange(Protocol):
    username: str | None
    authenticated: bool

    def step(self, data: bytes) -> bytes: ...


class Checks(Protocol):
    """What the flow asks of the outside world; :class:`AuthChecks` is the real one, unit
    tests pass their own."""

    async def admit(self, username: str) -> auth.Throttle: ...
    async def pause(self, seconds: float) -> None: ...
    async def check_password(self, username: str, password: str) -> Any | None: ...
    def scram_exchange(self, plus: bool) -> ScramExchange: ...
    async def scram_step(self, exchange: ScramExchange, data: bytes) -> bytes: ...
    async def find_account(self, username: str) -> Any | None: ...
    async def failed(self, username: str) -> None: ...
    async def undecided(self, username: str) -> None: ...
    async def succeeded(self, username: str) -> None: ...
    async def change_password(self, account: Any, old: str, new: str) -> None: ...
    async def set_verifier(self, account: Any, text: str) -> None: ...


class AuthChecks:
    """The checks of one connection from ``peer_host`` (throttle counts are per address),
    over :mod:`broker.services.auth`; ``server_cert`` (DER) is the certificate a TLS
    connection presented, for SCRAM's channel binding."""

    def __init__(self, peer_host: str, server_cert: bytes | None = None) -> None:
        self.peer_host = peer_host
        self.server_cert = server_cert

    async def admit(self, username: str) -> auth.Throttle:
        return await auth.admit_attempt(self.peer_host, username)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def check_password(self, username: str, password: str) -> Account | None:
        # Password hashing is slow by design: off the shared database thread.
        return await database_sync_to_async(
            auth.check_clear_password, thread_sensitive=False)(username, password)

    def scram_exchange(self, plus: bool) -> ScramExchange:
        return auth.scram_server(self.server_cert, plus=plus)

    async def scram_step(self, exchange: ScramExchange, data: bytes) -> bytes:
        # The first step looks the account up, the second derives keys: off the database
        # thread as well.
        return await database_sync_to_async(exchange.step, thread_sensitive=False)(data)

    async def find_account(self, username: str) -> Account | None:
        return await dbthread.run(auth.find_account, username)

    async def failed(self, username: str) -> None:
        await dbthread.run(auth.record_failure, self.peer_host, username)

    async def undecided(self, username: str) -> None:
        await auth.give_back_attempt(self.peer_host, username)

    async def succeeded(self, username: str) -> None:
        await dbthread.run(auth.record_success, self.peer_host, username)

    async def change_password(self, account: Account, old: str, new: str) -> None:
        await dbthread.run(account_service.change_password, account, old, new)

    async def set_verifier(self, account: Account, text: str) -> None:
        await dbthread.run(account_service.set_password_verifier, account, text)


_SCRAM_FIRST = (State.SCRAM_STARTED, State.CHANGE_SCRAM_STARTED)
_SCRAM_FINAL = (State.SCRAM_FIRST_SENT, State.CHANGE_SCRAM_FIRST_SENT)
_CHECKING = (State.CHECKING, State.CHANGE_CHECKING, State.CHANGING)


class LoginFlow:
    """One connection's login. ``methods`` are those the door offers on this connection
    (upper case); ``clear_allowed`` says whether a password may cross it in the clear (CLEAR,
    PLAIN, a password change)."""

    def __init__(self, checks: Checks, *, methods: tuple[str, ...] | list[str],
                 clear_allowed: bool) -> None:
        self.checks = checks
        self.methods = tuple(m.upper() for m in methods)
        self.clear_allowed = clear_allowed
        self.machine = table.LoginMachine()
        self.account: Any | None = None
        self._username: str | None = None  # named by LOGIN, PLAIN or the client-first
        self._method = ""
        self._exchange: ScramExchange | None = None
        self._admitted = False  # this attempt was counted (a failure is recorded)
        self._pending: table.Event | None = None  # the event being checked

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def logged_in(self) -> bool:
        return self.machine.logged_in

    @property
    def scram_expected(self) -> bool:
        """A SCRAM exchange waits for the client's next message."""
        return self.state in _SCRAM_FIRST or self.state in _SCRAM_FINAL

    @property
    def checking(self) -> bool:
        return self.state in _CHECKING

    # ------------------------------------------------------------------ client events

    def _handle(self, event: table.Event) -> State:
        try:
            return self.machine.handle(event)
        except table.IllegalLoginEvent as exc:
            raise LoginRefused(Reason.ALREADY_LOGGED_IN if exc.logged_in
                               else Reason.OUT_OF_ORDER) from exc

    def _begin(self, event: table.Event, username: str | None, method: str,
               label: str) -> None:
        self._handle(event)
        self._username, self._method, self._admitted = username, label, False
        self._exchange = (
            self.checks.scram_exchange(plus=method == "SCRAM-SHA-256-PLUS")
            if method in table.SCRAM_METHODS else None)

    def _check_method(self, method: str) -> None:
        """Refuse a method not offered here, or a password in the clear where it may not
        go; what was pending is dropped (a new attempt was asked for)."""
        reason = None
        if method not in self.methods:
            reason = Reason.METHOD
        elif method in table.CLEAR_METHODS and not self.clear_allowed:
            reason = Reason.CLEAR_ON_PLAIN
        if reason is not None:
            self.abort()
            raise LoginRefused(reason)

    def login(self, username: str, method: str, version: str) -> None:
        """SMQP ``LOGIN <username> <method>/<version>``."""
        if self.logged_in:
            raise LoginRefused(Reason.ALREADY_LOGGED_IN)
        method = method.upper()
        self._check_method(method)
        # Profile §5: the same answer whether or not the account exists.
        self._begin(table.Login(username, method), username, method, f"{method}/{version}")

    def mechanism(self, method: str) -> None:
        """SASL ``<auth mechanism=...>`` (the account is named in the exchange)."""
        if self.logged_in:
            raise LoginRefused(Reason.ALREADY_LOGGED_IN)
        method = method.upper()
        self._check_method(method)
        self._begin(table.Mechanism(method), None, method, method)

    def password(self, username: str, password: str) -> None:
        """A password in the clear: SMQP ``PASS`` (it must name LOGIN's account), or SASL
        PLAIN's credentials (they name the account)."""
        event = table.Pass(username, password)
        if not self.machine.allows(event):
            self._handle(event)  # refused: already logged in, or no LOGIN ... CLEAR before
        if self._username is not None and username.casefold() != self._username.casefold():
            raise LoginRefused(Reason.OTHER_ACCOUNT)
        self._handle(event)
        self._username = username
        self._pending = event

    def scram(self, data: bytes | None) -> None:
        """The client's next SCRAM message; None if the door could not decode it (the
        exchange then fails as the attempt it is)."""
        event: table.Event = (table.ClientFinal(data) if self.state in _SCRAM_FINAL
                              else table.ClientFirst(data))
        self._handle(event)
        self._pending = event

    def abort(self) -> None:
        """The client abandoned the exchange (or it was refused before it began)."""
        if self.machine.allows(table.Abort()):
            self.machine.handle(table.Abort())
        self._exchange = None
        self._pending = None

    def change_password(self, method: str) -> None:
        """SMQP ``SET LOGIN PASSWORD <method>``: with SCRAM the old password is proved by an
        exchange and the new one then comes salted; with CLEAR both come in ``PASS``."""
        method = method.upper()
        if method in table.SCRAM_METHODS and method in self.methods:
            # The new password's salted key crosses the wire as CLEAR's PASS does.
            if not self.clear_allowed:
                raise LoginRefused(Reason.CLEAR_ON_PLAIN)
            username = self.account.username if self.account is not None else None
            self._begin(table.ChangePassword(method), username, method, f"{method}/1.0")
            return
        if method != "CLEAR":
            raise LoginRefused(Reason.METHOD)
        self._handle(table.ChangePassword(method))

    def new_password(self, old: str, new: str) -> None:
        """``PASS <old> <new>`` after ``SET LOGIN PASSWORD CLEAR``."""
        event = table.NewPassword(old, new)
        self._handle(event)
        if not self.clear_allowed:
            # Both passwords cross the wire as CLEAR's do, whatever the login method was.
            self.machine.handle(table.Rejected())
            self._pending = None
            raise LoginRefused(Reason.CLEAR_ON_PLAIN)
        self._pending = event

    def new_verifier(self, text: str) -> None:
        """The new password's salted form after the SCRAM proof of the old one."""
        event = table.NewVerifier(text)
        self._handle(event)
        self._pending = event

    # ------------------------------------------------------------------ checks

    async def verify(self) -> Outcome:
        """Check what the last event brought (the state is CHECKING or CHANGING)."""
        event, self._pending = self._pending, None
        if isinstance(event, table.Pass):
            return await self._check_password(event)
        if isinstance(event, table.ClientFirst | table.ClientFinal):
            return await self._scram_step(event)
        if isinstance(event, table.NewPassword | table.NewVerifier):
            return await self._store_password(event)
        raise LoginRefused(Reason.OUT_OF_ORDER)

    def _refuse(self, outcome: table.Event, reason: Reason,
                data: bytes | None = None) -> LoginRefused:
        self.machine.handle(outcome)
        self._exchange = None
        return LoginRefused(reason, data)

    async def _admit(self, username: str) -> auth.Throttle:
        throttle = await self.checks.admit(username)
        if throttle.refused:
            raise self._refuse(table.Throttled(), Reason.THROTTLED)
        self._admitted = True
        return throttle

    async def _undecided(self, username: str) -> None:
        """The check of an admitted attempt raised (not a refusal: the database away): the
        attempt is given back, not a failure. What raised is the caller's to raise."""
        if self._admitted:
            self._admitted = False
            await self.checks.undecided(username)

    async def _fail(self, username: str, data: bytes | None = None) -> LoginRefused:
        if self._admitted:
            await self.checks.failed(username)
        return self._refuse(table.Rejected(), Reason.UNAUTHORIZED, data)

    async def _logged_in(self, username: str, account: Any, final: bytes | None) -> LoggedIn:
        await self.checks.succeeded(username)  # the name its attempt was counted under
        self.machine.handle(table.Verified())
        self.account, self._exchange = account, None
        return LoggedIn(account, self._method, final)

    async def _check_password(self, event: table.Pass) -> Outcome:
        throttle = await self._admit(event.username)
        if throttle.delay:
            await self.checks.pause(throttle.delay)
        try:
            account = await self.checks.check_password(event.username, event.password)
        except Exception:
            await self._undecided(event.username)
            raise
        if account is None:
            raise await self._fail(event.username)
        return await self._logged_in(event.username, account, None)

    async def _scram_step(self, event: table.ClientFirst | table.ClientFinal) -> Outcome:
        exchange, expected = self._exchange, self._username
        assert exchange is not None
        first = isinstance(event, table.ClientFirst)
        if first and expected is not None:  # the door named the account: count it now
            await self._admit(expected)
        try:
            if event.data is None:
                raise ScramError("malformed message")
            answer = await self.checks.scram_step(exchange, event.data)
            if expected is not None and (exchange.username is None
                                         or exchange.username.casefold() != expected.casefold()):
                raise ScramError("authentication failed")
        except ScramError:
            raise await self._fail(expected or exchange.username or "") from None
        except Exception:
            await self._undecided(expected or exchange.username or "")
            raise
        if first and not self._admitted and exchange.username is not None:
            await self._admit(exchange.username)  # the client-first named the account
        if not exchange.authenticated:
            self.machine.handle(table.Challenged())
            return Challenge(answer)
        username = exchange.username or ""
        if self.state is State.CHANGE_CHECKING:
            await self.checks.succeeded(username)
            self.machine.handle(table.Verified())
            self._exchange = None
            return Reproved(answer)
        account = await self.checks.find_account(username)
        if account is None:  # removed during the exchange
            raise await self._fail(username, answer)
        return await self._logged_in(username, account, answer)

    async def _store_password(self, event: table.NewPassword | table.NewVerifier) -> Outcome:
        try:
            if isinstance(event, table.NewPassword):
                await self.checks.change_password(self.account, event.old, event.new)
            else:
                await self.checks.set_verifier(self.account, event.text)
        except BaseException:
            self.machine.handle(table.Rejected())
            raise
        self.machine.handle(table.Changed())
        return PasswordChanged()
