"""The login state table (broker.domain.login) and the login service driving it
(broker.services.login), with no socket and no database: the checks are a fake that records
every call, and SCRAM runs the real exchange (accounts.scram over scramp) against credentials
made from a password in memory. Over real sockets: e2e/smqp/test_login_*, e2e/xmpp/test_login."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from accounts.scram import ScramClient, ScramCredentials, ScramServer, password_verifier
from broker.domain import login as table
from broker.domain.login import EVENT_TRIGGERED_TRANSITIONS, LoginMachine, State
from broker.services.auth import Throttle
from broker.services.login import (
    Challenge,
    LoggedIn,
    LoginFlow,
    LoginRefused,
    PasswordChanged,
    Reason,
    Reproved,
)

# One event of each kind the table knows (its key is what the table is indexed by).
SAMPLES: list[Any] = [
    table.Login("alice", "CLEAR"),
    table.Login("alice", "SCRAM-SHA-256"),
    table.Mechanism("PLAIN"),
    table.Mechanism("SCRAM-SHA-256"),
    table.Pass("alice", "secret"),
    table.ClientFirst(b"n,,n=alice,r=abc"),
    table.ClientFinal(b"c=biws,r=abc,p=xyz"),
    table.Abort(),
    table.ChangePassword("CLEAR"),
    table.ChangePassword("SCRAM-SHA-256"),
    table.NewPassword("old", "new"),
    table.NewVerifier("s=..,i=4096,p=.."),
    table.Challenged(),
    table.Verified(),
    table.Rejected(),
    table.Throttled(),
    table.Changed(),
]


def key(event: Any) -> Any:
    return getattr(event, "key", type(event))


LEGAL = [(state, event, target) for state, row in EVENT_TRIGGERED_TRANSITIONS.items()
         for event in SAMPLES if (target := row.get(key(event))) is not None]
ILLEGAL = [(state, event) for state, row in EVENT_TRIGGERED_TRANSITIONS.items()
           for event in SAMPLES if key(event) not in row]


def test_every_key_of_the_table_has_a_sample_event_and_every_state_a_row():
    assert set(EVENT_TRIGGERED_TRANSITIONS) == set(State)
    keys = {k for row in EVENT_TRIGGERED_TRANSITIONS.values() for k in row}
    assert keys == {key(event) for event in SAMPLES}


@pytest.mark.parametrize(("state", "event", "target"), LEGAL,
                         ids=[f"{s.name}-{e!r}" for s, e, _ in LEGAL])
def test_each_legal_transition(state, event, target):
    machine = LoginMachine(state)
    assert machine.allows(event)
    assert machine.handle(event) is target
    assert machine.state is target


@pytest.mark.parametrize(("state", "event"), ILLEGAL,
                         ids=[f"{s.name}-{e!r}" for s, e in ILLEGAL])
def test_each_illegal_event_is_refused_and_changes_nothing(state, event):
    machine = LoginMachine(state)
    assert not machine.allows(event)
    with pytest.raises(table.IllegalLoginEvent) as caught:
        machine.handle(event)
    assert machine.state is state
    assert caught.value.state is state and caught.value.event == event
    assert caught.value.logged_in is (state in table.LOGGED_IN)
    assert type(event).__name__ in str(caught.value) and state.name in str(caught.value)


def test_an_unknown_method_is_an_illegal_event_not_a_crash():
    machine = LoginMachine()
    with pytest.raises(table.IllegalLoginEvent):
        machine.handle(table.Login("alice", "DIGEST-MD5"))
    assert machine.state is State.START


def test_a_password_change_always_ends_logged_in():
    """Whatever happens to a change, the session stays logged in: every path from a change
    state leads back to AUTHENTICATED and never to START, FAILED or LOCKED."""
    change_states = table.LOGGED_IN - {State.AUTHENTICATED}
    for state in change_states:
        assert set(EVENT_TRIGGERED_TRANSITIONS[state].values()) <= table.LOGGED_IN


# --- the service, over fake checks ----------------------------------------------------------

ITERATIONS = 4096
SALT = "saltsaltsaltsaltsalt22"


@dataclass
class FakeChecks:
    """Accounts in memory; every call is recorded (the failure counting hooks among them)."""

    passwords: dict[str, str] = field(default_factory=lambda: {"alice": "secret"})
    throttle: Throttle = field(default_factory=lambda: Throttle(refused=False, delay=0.0))
    calls: list[tuple] = field(default_factory=list)
    change_error: Exception | None = None
    check_error: Exception | None = None  # what the password check raises (the database away)

    def _account(self, username: str) -> Any | None:
        name = next((n for n in self.passwords if n.casefold() == username.casefold()), None)
        return SimpleNamespace(username=name) if name is not None else None

    async def admit(self, username: str) -> Throttle:
        self.calls.append(("admit", username))
        return self.throttle

    async def pause(self, seconds: float) -> None:
        self.calls.append(("pause", seconds))

    async def check_password(self, username: str, password: str) -> Any | None:
        self.calls.append(("check_password", username))
        if self.check_error is not None:
            raise self.check_error
        account = self._account(username)
        return account if account and self.passwords[account.username] == password else None

    def scram_exchange(self, plus: bool) -> ScramServer:
        self.calls.append(("scram_exchange", plus))

        def lookup(username: str) -> ScramCredentials | None:
            account = self._account(username)
            if account is None:
                return None
            return ScramCredentials.from_password(self.passwords[account.username], SALT,
                                                  ITERATIONS)

        return ScramServer(lookup, dummy_secret=b"test", dummy_iterations=ITERATIONS)

    async def scram_step(self, exchange: ScramServer, data: bytes) -> bytes:
        self.calls.append(("scram_step",))
        return exchange.step(data)

    async def find_account(self, username: str) -> Any | None:
        self.calls.append(("find_account", username))
        return self._account(username)

    async def failed(self, username: str) -> None:
        self.calls.append(("failed", username))

    async def undecided(self, username: str) -> None:
        self.calls.append(("undecided", username))

    async def succeeded(self, username: str) -> None:
        self.calls.append(("succeeded", username))

    async def change_password(self, account: Any, old: str, new: str) -> None:
        self.calls.append(("change_password", account.username, old, new))
        if self.change_error is not None:
            raise self.change_error

    async def set_verifier(self, account: Any, text: str) -> None:
        self.calls.append(("set_verifier", account.username, text))

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]


SMQP_METHODS = ("CLEAR", "SCRAM-SHA-256")
TLS_METHODS = (*SMQP_METHODS, "SCRAM-SHA-256-PLUS")


def smqp(checks: FakeChecks, *, clear_allowed: bool = True,
         methods: tuple[str, ...] = SMQP_METHODS) -> LoginFlow:
    return LoginFlow(checks, methods=methods, clear_allowed=clear_allowed)


async def clear_login(flow: LoginFlow, user: str = "alice", password: str = "secret"):
    flow.login(user, "CLEAR", "1.0")
    flow.password(user, password)
    return await flow.verify()


async def send_client_final(flow: LoginFlow, client: ScramClient) -> None:
    """Run the exchange up to the client-final, which the caller then has checked."""
    flow.scram(client.first())
    challenge = await flow.verify()
    assert isinstance(challenge, Challenge)
    flow.scram(client.final(challenge.data))


async def refused(coro_or_call) -> Reason:
    with pytest.raises(LoginRefused) as caught:
        await coro_or_call
    return caught.value.reason


# -- CLEAR


async def test_clear_login_counts_the_attempt_then_clears_it():
    checks = FakeChecks()
    flow = smqp(checks)
    flow.login("Alice", "clear", "1.0")
    assert flow.state is State.USER_GIVEN
    flow.password("alice", "secret")  # the name compared without case
    assert flow.state is State.CHECKING and flow.checking
    outcome = await flow.verify()
    assert isinstance(outcome, LoggedIn)
    assert outcome.method == "CLEAR/1.0" and outcome.final is None
    assert outcome.account.username == "alice" and flow.account is outcome.account
    assert flow.state is State.AUTHENTICATED and flow.logged_in
    assert checks.calls == [("admit", "alice"), ("check_password", "alice"),
                            ("succeeded", "alice")]


async def test_a_wrong_password_is_recorded_as_a_failure_and_a_new_login_may_follow():
    checks = FakeChecks()
    flow = smqp(checks)
    assert await refused(clear_login(flow, password="wrong")) is Reason.UNAUTHORIZED
    assert flow.state is State.FAILED and not flow.logged_in
    assert checks.names() == ["admit", "check_password", "failed"]
    assert isinstance(await clear_login(flow), LoggedIn)


async def test_a_check_that_raises_gives_the_attempt_back_instead_of_failing_it():
    """The database away during the check: the attempt decided nothing, so it is not a
    failure (the throttle would lock out every client reconnecting through an outage)."""
    checks = FakeChecks(check_error=OSError("connection refused"))
    flow = smqp(checks)
    with pytest.raises(OSError):
        await clear_login(flow)
    assert checks.calls == [("admit", "alice"), ("check_password", "alice"),
                            ("undecided", "alice")]


async def test_an_unknown_account_fails_as_a_wrong_password():
    checks = FakeChecks()
    flow = smqp(checks)
    assert await refused(clear_login(flow, user="mallory")) is Reason.UNAUTHORIZED
    assert checks.calls[-1] == ("failed", "mallory")


async def test_a_throttled_attempt_checks_no_password_and_records_no_failure():
    checks = FakeChecks(throttle=Throttle(refused=True, delay=0.0))
    flow = smqp(checks)
    assert await refused(clear_login(flow)) is Reason.THROTTLED
    assert flow.state is State.LOCKED
    assert checks.names() == ["admit"]
    flow.login("alice", "CLEAR", "1.0")  # a new attempt may begin (and is counted again)
    assert flow.state is State.USER_GIVEN


async def test_a_slowed_attempt_waits_its_delay_before_the_check():
    checks = FakeChecks(throttle=Throttle(refused=False, delay=2.0))
    flow = smqp(checks)
    assert isinstance(await clear_login(flow), LoggedIn)
    assert checks.names() == ["admit", "pause", "check_password", "succeeded"]
    assert checks.calls[1] == ("pause", 2.0)


async def test_pass_naming_another_account_is_refused_and_login_stays_pending():
    flow = smqp(FakeChecks())
    flow.login("alice", "CLEAR", "1.0")
    with pytest.raises(LoginRefused) as caught:
        flow.password("bob", "secret")
    assert caught.value.reason is Reason.OTHER_ACCOUNT
    assert flow.state is State.USER_GIVEN


async def test_pass_out_of_order_and_after_login():
    flow = smqp(FakeChecks())
    with pytest.raises(LoginRefused) as caught:
        flow.password("alice", "secret")
    assert caught.value.reason is Reason.OUT_OF_ORDER
    await clear_login(flow)
    for step in (lambda: flow.password("alice", "secret"),
                 lambda: flow.login("alice", "CLEAR", "1.0"),
                 lambda: flow.scram(b"x")):
        with pytest.raises(LoginRefused) as caught:
            step()
        assert caught.value.reason is Reason.ALREADY_LOGGED_IN
    assert flow.state is State.AUTHENTICATED


async def test_a_method_not_offered_drops_what_was_pending():
    checks = FakeChecks()
    flow = smqp(checks)
    flow.login("alice", "CLEAR", "1.0")
    with pytest.raises(LoginRefused) as caught:
        flow.login("alice", "SCRAM-SHA-256-PLUS", "1.0")  # offered on TLS only
    assert caught.value.reason is Reason.METHOD
    assert flow.state is State.START
    with pytest.raises(LoginRefused) as caught:
        flow.password("alice", "secret")
    assert caught.value.reason is Reason.OUT_OF_ORDER


async def test_clear_where_it_may_not_go():
    flow = smqp(FakeChecks(), clear_allowed=False)
    with pytest.raises(LoginRefused) as caught:
        flow.login("alice", "CLEAR", "1.0")
    assert caught.value.reason is Reason.CLEAR_ON_PLAIN
    assert flow.state is State.START
    flow.login("alice", "SCRAM-SHA-256", "1.0")  # SCRAM is fine there
    assert flow.state is State.SCRAM_STARTED and flow.scram_expected


# -- SCRAM


async def test_scram_login_named_by_login_is_counted_before_the_exchange():
    checks = FakeChecks()
    flow = smqp(checks, methods=TLS_METHODS)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    assert flow.state is State.SCRAM_STARTED and flow.scram_expected
    assert checks.calls == [("scram_exchange", False)]
    client = ScramClient("alice", "secret")
    flow.scram(client.first())
    challenge = await flow.verify()
    assert isinstance(challenge, Challenge)
    assert flow.state is State.SCRAM_FIRST_SENT
    flow.scram(client.final(challenge.data))
    outcome = await flow.verify()
    assert isinstance(outcome, LoggedIn) and outcome.method == "SCRAM-SHA-256/1.0"
    client.verify(outcome.final)  # the server proved itself too
    assert flow.state is State.AUTHENTICATED
    assert checks.names() == ["scram_exchange", "admit", "scram_step", "scram_step",
                              "find_account", "succeeded"]


async def test_scram_plus_asks_for_a_bound_exchange():
    checks = FakeChecks()
    flow = smqp(checks, methods=TLS_METHODS)
    flow.login("alice", "SCRAM-SHA-256-PLUS", "1.0")
    assert checks.calls == [("scram_exchange", True)]


async def test_sasl_scram_is_counted_once_the_client_first_names_the_account():
    checks = FakeChecks()
    flow = LoginFlow(checks, methods=["SCRAM-SHA-256"], clear_allowed=False)
    flow.mechanism("SCRAM-SHA-256")
    client = ScramClient("alice", "secret")
    flow.scram(client.first())
    challenge = await flow.verify()
    assert checks.names() == ["scram_exchange", "scram_step", "admit"]
    flow.scram(client.final(challenge.data))
    outcome = await flow.verify()
    assert isinstance(outcome, LoggedIn) and outcome.method == "SCRAM-SHA-256"


async def test_scram_wrong_password_is_a_recorded_failure():
    checks = FakeChecks()
    flow = smqp(checks)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    client = ScramClient("alice", "wrong")
    await send_client_final(flow, client)
    assert await refused(flow.verify()) is Reason.UNAUTHORIZED
    assert flow.state is State.FAILED
    assert checks.calls[-1] == ("failed", "alice")


async def test_scram_for_another_account_than_login_named_fails():
    checks = FakeChecks(passwords={"alice": "secret", "bob": "secret"})
    flow = smqp(checks)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    flow.scram(ScramClient("bob", "secret").first())
    assert await refused(flow.verify()) is Reason.UNAUTHORIZED
    assert checks.calls[-1] == ("failed", "alice")


async def test_an_undecodable_scram_line_fails_as_the_attempt_it_is():
    checks = FakeChecks()
    flow = smqp(checks)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    flow.scram(None)
    assert await refused(flow.verify()) is Reason.UNAUTHORIZED
    assert checks.names() == ["scram_exchange", "admit", "failed"]


async def test_a_malformed_sasl_client_first_was_never_counted_so_records_nothing():
    checks = FakeChecks()
    flow = LoginFlow(checks, methods=["SCRAM-SHA-256"], clear_allowed=False)
    flow.mechanism("SCRAM-SHA-256")
    flow.scram(b"not a client-first")
    assert await refused(flow.verify()) is Reason.UNAUTHORIZED
    assert "admit" not in checks.names() and "failed" not in checks.names()
    assert flow.state is State.FAILED


async def test_a_throttled_scram_attempt_is_refused_before_the_exchange():
    checks = FakeChecks(throttle=Throttle(refused=True, delay=0.0))
    flow = smqp(checks)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    flow.scram(ScramClient("alice", "secret").first())
    assert await refused(flow.verify()) is Reason.THROTTLED
    assert checks.names() == ["scram_exchange", "admit"]
    assert flow.state is State.LOCKED


async def test_an_account_removed_during_the_exchange_fails_after_the_server_final():
    checks = FakeChecks()
    flow = smqp(checks)
    flow.login("alice", "SCRAM-SHA-256", "1.0")
    client = ScramClient("alice", "secret")
    await send_client_final(flow, client)
    checks.passwords.clear()
    with pytest.raises(LoginRefused) as caught:
        await flow.verify()
    assert caught.value.reason is Reason.UNAUTHORIZED
    client.verify(caught.value.data)  # the SMQP door still writes it before the 401
    assert checks.calls[-1] == ("failed", "alice")


async def test_scram_messages_out_of_order():
    flow = smqp(FakeChecks())
    with pytest.raises(LoginRefused) as caught:
        flow.scram(b"n,,n=alice,r=abc")
    assert caught.value.reason is Reason.OUT_OF_ORDER
    assert await refused(flow.verify()) is Reason.OUT_OF_ORDER  # nothing to check


# -- SASL PLAIN and abort


async def test_plain_names_the_account_in_its_credentials():
    checks = FakeChecks()
    flow = LoginFlow(checks, methods=["SCRAM-SHA-256", "PLAIN"], clear_allowed=True)
    flow.mechanism("PLAIN")
    assert flow.state is State.PLAIN_EXPECTED
    flow.password("alice", "secret")
    outcome = await flow.verify()
    assert isinstance(outcome, LoggedIn) and outcome.method == "PLAIN"
    assert checks.names() == ["admit", "check_password", "succeeded"]


async def test_plain_not_offered():
    flow = LoginFlow(FakeChecks(), methods=["SCRAM-SHA-256"], clear_allowed=False)
    with pytest.raises(LoginRefused) as caught:
        flow.mechanism("PLAIN")
    assert caught.value.reason is Reason.METHOD


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_abort_returns_to_start_and_a_new_exchange_may_begin(mechanism):
    flow = LoginFlow(FakeChecks(), methods=["SCRAM-SHA-256", "PLAIN"], clear_allowed=True)
    flow.mechanism(mechanism)
    flow.abort()
    assert flow.state is State.START and not flow.scram_expected
    flow.mechanism(mechanism)


# -- password change


async def logged_in_flow(checks: FakeChecks, **kwargs) -> LoginFlow:
    flow = smqp(checks, **kwargs)
    await clear_login(flow)
    checks.calls.clear()
    return flow


async def test_clear_password_change():
    checks = FakeChecks()
    flow = await logged_in_flow(checks)
    flow.change_password("CLEAR")
    assert flow.state is State.CHANGE_CLEAR
    flow.new_password("secret", "better")
    assert isinstance(await flow.verify(), PasswordChanged)
    assert flow.state is State.AUTHENTICATED
    assert checks.calls == [("change_password", "alice", "secret", "better")]


async def test_a_refused_change_leaves_the_session_logged_in():
    error = ValueError("old password is not correct")
    checks = FakeChecks(change_error=error)
    flow = await logged_in_flow(checks)
    flow.change_password("CLEAR")
    flow.new_password("wrong", "better")
    with pytest.raises(ValueError):
        await flow.verify()
    assert flow.state is State.AUTHENTICATED


async def test_a_clear_change_where_no_password_may_go_in_the_clear():
    checks = FakeChecks()
    flow = smqp(checks, clear_allowed=True)
    await clear_login(flow)
    flow.clear_allowed = False  # (a SCRAM login on plain TCP, in the real door)
    flow.change_password("CLEAR")  # refused only at its PASS, as before
    with pytest.raises(LoginRefused) as caught:
        flow.new_password("secret", "better")
    assert caught.value.reason is Reason.CLEAR_ON_PLAIN
    assert flow.state is State.AUTHENTICATED
    with pytest.raises(LoginRefused) as caught:
        flow.change_password("SCRAM-SHA-256")
    assert caught.value.reason is Reason.CLEAR_ON_PLAIN
    assert flow.state is State.AUTHENTICATED


async def test_change_to_a_method_not_offered():
    flow = await logged_in_flow(FakeChecks())
    for method in ("SCRAM-SHA-256-PLUS", "DIGEST-MD5"):
        with pytest.raises(LoginRefused) as caught:
            flow.change_password(method)
        assert caught.value.reason is Reason.METHOD
    assert flow.state is State.AUTHENTICATED


async def test_scram_password_change_proves_the_old_password_then_takes_the_verifier():
    checks = FakeChecks()
    flow = await logged_in_flow(checks)
    flow.change_password("SCRAM-SHA-256")
    assert flow.state is State.CHANGE_SCRAM_STARTED and flow.scram_expected
    client = ScramClient("alice", "secret")
    flow.scram(client.first())
    challenge = await flow.verify()
    assert isinstance(challenge, Challenge) and flow.state is State.CHANGE_SCRAM_FIRST_SENT
    flow.scram(client.final(challenge.data))
    reproved = await flow.verify()
    assert isinstance(reproved, Reproved)
    client.verify(reproved.final)
    assert flow.state is State.NEW_VERIFIER_EXPECTED
    verifier = password_verifier("better", ITERATIONS).decode()
    flow.new_verifier(verifier)
    assert isinstance(await flow.verify(), PasswordChanged)
    assert flow.state is State.AUTHENTICATED
    assert checks.names() == ["scram_exchange", "admit", "scram_step", "scram_step",
                              "succeeded", "set_verifier"]
    assert checks.calls[-1] == ("set_verifier", "alice", verifier)


async def test_a_failed_scram_proof_of_the_old_password_keeps_the_session():
    checks = FakeChecks()
    flow = await logged_in_flow(checks)
    flow.change_password("SCRAM-SHA-256")
    client = ScramClient("alice", "wrong")
    await send_client_final(flow, client)
    assert await refused(flow.verify()) is Reason.UNAUTHORIZED
    assert flow.state is State.AUTHENTICATED and flow.logged_in
    assert checks.calls[-1] == ("failed", "alice")
    with pytest.raises(LoginRefused) as caught:
        flow.new_verifier("s=..,i=4096,p=..")  # no proof, no new password
    assert caught.value.reason is Reason.ALREADY_LOGGED_IN
