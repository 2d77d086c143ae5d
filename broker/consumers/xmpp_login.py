"""The XMPP door's SASL exchange (XMPP-PROFILE §2): PLAIN and SCRAM-SHA-256 over the shared
login state table (:class:`broker.services.login.LoginFlow`), each refusal a SASL failure.
The door (:class:`broker.consumers.xmpp.XMPPConsumer`) mixes it in; binding a resource once
authenticated is the door's (``iq_bind``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accounts.models import Account
from broker.domain.login import State as LoginState
from broker.services.login import Challenge, LoggedIn, LoginFlow, LoginRefused, Reason
from broker.xmpp import stanzas as s
from broker.xmpp import stream as xs

# Login refusals (broker.services.login) as SASL failures (condition, text); else "aborted".
SASL_FAILURES = {
    Reason.THROTTLED: ("temporary-auth-failure", "too many failed logins; try again later"),
    Reason.UNAUTHORIZED: ("not-authorized",),
    Reason.METHOD: ("invalid-mechanism",),
    Reason.CLEAR_ON_PLAIN: ("invalid-mechanism",),
}


class SaslLogin:
    """The SASL exchange of one XMPP stream (a mixin of the door's consumer)."""

    login: LoginFlow
    stream: xs.ServerStream
    domain: str
    authenticated: Account | None
    _method: str

    if TYPE_CHECKING:  # what the door provides
        async def _write(self, text: str) -> bool: ...

    def _reset_auth(self) -> None:
        self.login.abort()
        self.stream.sasl_failed()

    async def _auth_failed(self, condition: str, text: str = "") -> None:
        self._reset_auth()  # after a failed check the login stays FAILED / LOCKED
        await self._write(s.sasl_failure(condition, text))

    async def _refused(self, exc: LoginRefused) -> None:
        """The one place a login refusal becomes a SASL failure (XMPP-PROFILE §2)."""
        await self._auth_failed(*SASL_FAILURES.get(exc.reason, ("aborted",)))

    async def _auth_start(self, event: xs.AuthStart) -> None:
        try:
            self.login.mechanism(event.mechanism)
            if event.initial is None:
                await self._write(s.sasl_challenge(b""))
            elif event.mechanism == "PLAIN":
                await self._plain(event.initial)
            else:
                await self._scram_step(event.initial)
        except LoginRefused as exc:
            await self._refused(exc)

    async def _auth_response(self, data: bytes) -> None:
        try:
            if self.login.state is LoginState.PLAIN_EXPECTED:
                await self._plain(data)
            elif self.login.scram_expected:
                await self._scram_step(data)
            else:
                await self._auth_failed("aborted")
        except LoginRefused as exc:
            await self._refused(exc)

    async def _plain(self, data: bytes) -> None:
        credentials = xs.plain_credentials(data, self.domain)
        if isinstance(credentials, str):
            await self._auth_failed(credentials)
            return
        self.login.password(*credentials)
        await self._verify()

    async def _scram_step(self, data: bytes) -> None:
        self.login.scram(data)
        await self._verify()

    async def _verify(self) -> None:
        outcome = await self.login.verify()
        if isinstance(outcome, Challenge):
            await self._write(s.sasl_challenge(outcome.data))
            return
        assert isinstance(outcome, LoggedIn)
        self.authenticated = outcome.account
        self._method = outcome.method
        self.stream.authenticated()
        await self._write(s.sasl_success(outcome.final))
