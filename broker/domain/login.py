"""Login as one explicit state machine, shared by every door (issue 38).

Sans-IO, h11-style (``h11/_state.py``): the states, the events and one transition table,
:data:`EVENT_TRIGGERED_TRANSITIONS`. An event the table has no entry for in the current state
raises :class:`IllegalLoginEvent` and changes nothing. No password is checked here and no byte
is written: :mod:`broker.services.login` drives the checks (throttle, CLEAR / PLAIN, SCRAM,
password change) and feeds their outcomes back as events; each door only encodes them
(SMQP reply lines, XMPP SASL elements).

The doors' vocabulary maps onto the events:

- SMQP ``LOGIN <user> CLEAR/1.0`` then ``PASS``: :class:`Login` (CLEAR), :class:`Pass`.
- SMQP ``LOGIN <user> SCRAM-SHA-256[-PLUS]/1.0`` then raw lines, XMPP ``<auth
  mechanism='SCRAM-SHA-256'>`` then ``<response/>``: :class:`Login` / :class:`Mechanism`
  (SCRAM), :class:`ClientFirst`, :class:`ClientFinal`.
- XMPP ``<auth mechanism='PLAIN'>``: :class:`Mechanism` (PLAIN), :class:`Pass`.
- SMQP ``SET LOGIN PASSWORD CLEAR`` then ``PASS <old> <new>``: :class:`ChangePassword`,
  :class:`NewPassword`; ``SET LOGIN PASSWORD SCRAM-SHA-256`` proves the old password with a
  SCRAM exchange, then :class:`NewVerifier` carries the new one (salted, never in the clear).
- XMPP ``<abort/>``, or an attempt refused before it began: :class:`Abort`.

Outcome events (:class:`Challenged`, :class:`Verified`, :class:`Rejected`, :class:`Throttled`,
:class:`Changed`) leave the CHECKING / CHANGING states; only the login service sends them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "CLEAR_METHODS",
    "EVENT_TRIGGERED_TRANSITIONS",
    "LOGGED_IN",
    "SCRAM_METHODS",
    "Abort",
    "Challenged",
    "ChangePassword",
    "Changed",
    "ClientFinal",
    "ClientFirst",
    "IllegalLoginEvent",
    "Login",
    "LoginMachine",
    "Mechanism",
    "NewPassword",
    "NewVerifier",
    "Pass",
    "Rejected",
    "State",
    "Throttled",
    "Verified",
    "family",
]

# Methods whose password crosses the wire as it is (SMQP CLEAR, SASL PLAIN), and SCRAM's.
CLEAR_METHODS = ("CLEAR", "PLAIN")
SCRAM_METHODS = ("SCRAM-SHA-256", "SCRAM-SHA-256-PLUS")


def family(method: str) -> str:
    """``CLEAR``, ``PLAIN`` or ``SCRAM``: what a method's exchange looks like."""
    method = method.upper()
    if method in SCRAM_METHODS:
        return "SCRAM"
    if method in CLEAR_METHODS:
        return method
    raise ValueError(f"unknown authentication method {method!r}")


class State(enum.Enum):
    START = "START"  # nothing in progress, not logged in
    USER_GIVEN = "USER_GIVEN"  # LOGIN <user> CLEAR taken: PASS expected
    PLAIN_EXPECTED = "PLAIN_EXPECTED"  # SASL PLAIN begun: the credentials expected
    SCRAM_STARTED = "SCRAM_STARTED"  # SCRAM begun: client-first expected
    SCRAM_FIRST_SENT = "SCRAM_FIRST_SENT"  # server-first sent: client-final expected
    CHECKING = "CHECKING"  # a login attempt is being admitted and checked
    FAILED = "FAILED"  # the last attempt failed; another may begin
    LOCKED = "LOCKED"  # the last attempt was refused by the throttle; another may begin
    AUTHENTICATED = "AUTHENTICATED"
    # Password change, always from AUTHENTICATED and back to it, whatever the outcome.
    CHANGE_CLEAR = "CHANGE_CLEAR"  # SET LOGIN PASSWORD CLEAR: PASS <old> <new> expected
    CHANGE_SCRAM_STARTED = "CHANGE_SCRAM_STARTED"  # the old password proved by SCRAM...
    CHANGE_SCRAM_FIRST_SENT = "CHANGE_SCRAM_FIRST_SENT"
    CHANGE_CHECKING = "CHANGE_CHECKING"
    NEW_VERIFIER_EXPECTED = "NEW_VERIFIER_EXPECTED"  # ...then the new salted password
    CHANGING = "CHANGING"  # the new password is being stored


# States of a logged-in session (an event refused there is "already logged in").
LOGGED_IN = frozenset({
    State.AUTHENTICATED, State.CHANGE_CLEAR, State.CHANGE_SCRAM_STARTED,
    State.CHANGE_SCRAM_FIRST_SENT, State.CHANGE_CHECKING, State.NEW_VERIFIER_EXPECTED,
    State.CHANGING,
})


# --- events: what the client did ----------------------------------------------------------


@dataclass(frozen=True)
class Login:
    """SMQP ``LOGIN``: names the account and the method (CLEAR or SCRAM)."""

    username: str
    method: str

    @property
    def key(self) -> tuple[type, str]:
        return (Login, family(self.method))


@dataclass(frozen=True)
class Mechanism:
    """XMPP ``<auth mechanism=...>``: the account is named later, in the exchange."""

    method: str

    @property
    def key(self) -> tuple[type, str]:
        return (Mechanism, family(self.method))


@dataclass(frozen=True)
class Pass:
    """A password in the clear: SMQP ``PASS`` after ``LOGIN ... CLEAR``, or SASL PLAIN's."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ClientFirst:
    data: bytes | None  # None: the door could not decode the message


@dataclass(frozen=True)
class ClientFinal:
    data: bytes | None


@dataclass(frozen=True)
class Abort:
    """The client abandoned the exchange, or the attempt was refused before it began."""


@dataclass(frozen=True)
class ChangePassword:
    """SMQP ``SET LOGIN PASSWORD <method>``."""

    method: str

    @property
    def key(self) -> tuple[type, str]:
        return (ChangePassword, "SCRAM" if family(self.method) == "SCRAM" else "CLEAR")


@dataclass(frozen=True)
class NewPassword:
    """``PASS <old> <new>`` after ``SET LOGIN PASSWORD CLEAR``."""

    old: str = field(repr=False)
    new: str = field(repr=False)


@dataclass(frozen=True)
class NewVerifier:
    """The new password's salted form (``s=..,i=..,p=..``) after the SCRAM proof."""

    text: str = field(repr=False)


# --- events: what the checks found (sent by the login service) ---------------------------------


@dataclass(frozen=True)
class Challenged:
    """The SCRAM server-first message goes to the client; the exchange goes on."""


@dataclass(frozen=True)
class Verified:
    """The password (or the SCRAM proof) was right."""


@dataclass(frozen=True)
class Rejected:
    """A wrong password, a failed SCRAM exchange, an unknown account, a refused change."""


@dataclass(frozen=True)
class Throttled:
    """Too many failed attempts: refused before any password was checked."""


@dataclass(frozen=True)
class Changed:
    """The new password is stored."""


Event = (Login | Mechanism | Pass | ClientFirst | ClientFinal | Abort | ChangePassword
         | NewPassword | NewVerifier | Challenged | Verified | Rejected | Throttled | Changed)


def _key(event: Event) -> type | tuple[type, str] | None:
    try:
        return getattr(event, "key", type(event))
    except ValueError:  # an unknown method: no transition takes it
        return None


# What may begin a login attempt: from any state of a session not logged in and not checking.
# A new LOGIN replaces one whose PASS never came (SMQP); SASL allows one exchange at a time,
# which the XMPP stream codec enforces before an event gets here.
_BEGIN: dict[type | tuple[type, str], State] = {
    (Login, "CLEAR"): State.USER_GIVEN,
    (Login, "SCRAM"): State.SCRAM_STARTED,
    (Mechanism, "PLAIN"): State.PLAIN_EXPECTED,
    (Mechanism, "SCRAM"): State.SCRAM_STARTED,
    Abort: State.START,
}

_CHANGE: dict[type | tuple[type, str], State] = {
    (ChangePassword, "CLEAR"): State.CHANGE_CLEAR,
    (ChangePassword, "SCRAM"): State.CHANGE_SCRAM_STARTED,
}

EVENT_TRIGGERED_TRANSITIONS: dict[State, dict[type | tuple[type, str], State]] = {
    State.START: dict(_BEGIN),
    # Nothing in progress to abort: the outcome of the last attempt stays.
    State.FAILED: {**_BEGIN, Abort: State.FAILED},
    State.LOCKED: {**_BEGIN, Abort: State.LOCKED},
    State.USER_GIVEN: {**_BEGIN, Pass: State.CHECKING},
    State.PLAIN_EXPECTED: {Pass: State.CHECKING, Abort: State.START},
    State.SCRAM_STARTED: {ClientFirst: State.CHECKING, Abort: State.START},
    State.SCRAM_FIRST_SENT: {ClientFinal: State.CHECKING, Abort: State.START},
    State.CHECKING: {
        Challenged: State.SCRAM_FIRST_SENT,
        Verified: State.AUTHENTICATED,
        Rejected: State.FAILED,
        Throttled: State.LOCKED,
    },
    State.AUTHENTICATED: dict(_CHANGE),
    # A CLEAR change whose PASS never came may be replaced by another SET LOGIN PASSWORD.
    State.CHANGE_CLEAR: {**_CHANGE, NewPassword: State.CHANGING, Abort: State.AUTHENTICATED},
    State.CHANGE_SCRAM_STARTED: {ClientFirst: State.CHANGE_CHECKING,
                                 Abort: State.AUTHENTICATED},
    State.CHANGE_SCRAM_FIRST_SENT: {ClientFinal: State.CHANGE_CHECKING,
                                    Abort: State.AUTHENTICATED},
    State.CHANGE_CHECKING: {
        Challenged: State.CHANGE_SCRAM_FIRST_SENT,
        Verified: State.NEW_VERIFIER_EXPECTED,
        Rejected: State.AUTHENTICATED,
        Throttled: State.AUTHENTICATED,
    },
    State.NEW_VERIFIER_EXPECTED: {NewVerifier: State.CHANGING},
    State.CHANGING: {Changed: State.AUTHENTICATED, Rejected: State.AUTHENTICATED},
}


class IllegalLoginEvent(Exception):
    """An event the table does not allow in the current state (nothing changed)."""

    def __init__(self, state: State, event: Event) -> None:
        super().__init__(f"{type(event).__name__} is not allowed in state {state.name}")
        self.state = state
        self.event = event

    @property
    def logged_in(self) -> bool:
        """Refused because the session is logged in already (not merely out of order)."""
        return self.state in LOGGED_IN


class LoginMachine:
    """One connection's login state: :meth:`handle` applies one event by the table."""

    def __init__(self, state: State = State.START) -> None:
        self.state = state

    def allows(self, event: Event) -> bool:
        return _key(event) in EVENT_TRIGGERED_TRANSITIONS[self.state]

    def handle(self, event: Event) -> State:
        target = EVENT_TRIGGERED_TRANSITIONS[self.state].get(_key(event))  # type: ignore[arg-type]
        if target is None:
            raise IllegalLoginEvent(self.state, event)
        self.state = target
        return target

    @property
    def logged_in(self) -> bool:
        return self.state in LOGGED_IN
