"""The SMQP door's login commands (profile §5): LOGIN, PASS, the SCRAM exchange's raw lines
and SET LOGIN, over the shared login state table (:class:`broker.services.login.LoginFlow`).
The door (:class:`broker.consumers.smqp.SMQPConsumer`) mixes them in; what a session does
once logged in is the door's (``_logged_in``)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from accounts.models import Account
from broker.domain.login import State as LoginState
from broker.services import accounts as account_service
from broker.services.login import Challenge, LoggedIn, LoginFlow, LoginRefused, Reason, Reproved
from broker.smqp import commands as c
from broker.smqp.connection import ServerConnection
from broker.store import dbthread

# Login refusals (broker.services.login) as replies, and the texts some commands give instead.
LOGIN_REPLIES: dict[Reason | tuple[Reason, type], tuple[int, str]] = {
    Reason.ALREADY_LOGGED_IN: (405, "Not allowed (already logged in)"),
    Reason.METHOD: (405, "Not allowed (authentication method)"),
    Reason.CLEAR_ON_PLAIN: (405, "Not allowed (CLEAR on plain TCP; use SMQPS or SCRAM-SHA-256)"),
    (Reason.CLEAR_ON_PLAIN, c.Pass): (
        405, "Not allowed (password in the clear on plain TCP; use SMQPS)"),
    (Reason.CLEAR_ON_PLAIN, c.SetLogin): (
        405, "Not allowed (new password on plain TCP; use SMQPS)"),
    Reason.OUT_OF_ORDER: (400, "Bad request (no authentication exchange in progress)"),
    (Reason.OUT_OF_ORDER, c.Pass): (400, "Bad request (PASS follows LOGIN ... CLEAR/1.0)"),
    (Reason.ALREADY_LOGGED_IN, c.RawLine): (
        400, "Bad request (no authentication exchange in progress)"),
    Reason.OTHER_ACCOUNT: (400, "Bad request (PASS names another account than LOGIN)"),
    Reason.THROTTLED: (401, "Unauthorized (too many failed logins; try again later)"),
    Reason.UNAUTHORIZED: (401, "Unauthorized"),
}


class LoginCommands:
    """The login commands of one SMQP session (a mixin of the door's consumer)."""

    login: LoginFlow
    codec: ServerConnection
    account: Account | None
    _out: bytearray

    if TYPE_CHECKING:  # what the door provides
        def reply(self, code: int, *lines: str) -> None: ...
        async def flush(self, *, close: bool = False) -> None: ...
        async def _logged_in(self, account: Account, method: str) -> None: ...

    async def cmd_login(self, cmd: c.Login) -> None:
        self.login.login(cmd.username, cmd.method, cmd.version)
        if self.login.scram_expected:
            self.reply(200, "OK", "+ ")
            self.codec.expect_raw_line()
            return
        self.reply(200, "OK")

    async def cmd_raw_line(self, cmd: c.RawLine) -> None:
        """One client line of a SCRAM-SHA-256(-PLUS) exchange (base64). The server answers
        ``+ <base64 server-first>``; after the client-final it sends ``+ <base64
        server-final>`` followed at once by the login reply (or 401). After the exchange of
        SET LOGIN PASSWORD SCRAM-SHA-256, one more line carries the new password (salted)."""
        if self.login.state is LoginState.NEW_VERIFIER_EXPECTED:
            self.login.new_verifier(cmd.text.strip())
            await self.login.verify()
            self.reply(200, "OK")
            return
        try:
            data: bytes | None = base64.b64decode(cmd.text.strip(), validate=True)
        except ValueError:
            data = None  # the exchange fails (after its attempt is counted)
        self.login.scram(data)
        outcome = await self.login.verify()
        assert isinstance(outcome, Challenge | Reproved | LoggedIn)
        self._out += b"+ " + base64.b64encode(
            outcome.data if isinstance(outcome, Challenge) else outcome.final or b"") + b"\r\n"
        if not isinstance(outcome, LoggedIn):  # the client-final, or the new password next
            self.codec.expect_raw_line()
            return
        await self._logged_in(outcome.account, outcome.method)

    async def cmd_pass(self, cmd: c.Pass) -> None:
        if self.login.state is LoginState.CHANGE_CLEAR:  # PASS <old> <new>
            self.login.new_password(cmd.user, cmd.secret)
            await self.login.verify()
            self.reply(200, "OK")
            return
        self.login.password(cmd.user, cmd.secret)
        await self.flush()
        outcome = await self.login.verify()
        assert isinstance(outcome, LoggedIn)
        await self._logged_in(outcome.account, outcome.method)

    def _login_refused(self, exc: LoginRefused, command: Any) -> None:
        """The one place a login refusal becomes an SMQP reply (profile §5)."""
        if exc.data is not None:  # the server-final went before the refusal
            self._out += b"+ " + base64.b64encode(exc.data) + b"\r\n"
        code, text = LOGIN_REPLIES.get((exc.reason, type(command)), LOGIN_REPLIES[exc.reason])
        self.reply(code, text)

    async def cmd_set_login(self, cmd: c.SetLogin) -> None:
        if cmd.field == "PASSWORD":
            self.login.change_password(cmd.value.partition("/")[0])
            if self.login.scram_expected:  # the old password proved first
                self.reply(200, "OK", "+ ")
                self.codec.expect_raw_line()
                return
            self.reply(200, "OK")  # PASS <old> <new> next
            return
        await dbthread.run(account_service.set_detail, self.account, cmd.field, cmd.value)
        self.reply(200, "OK")
