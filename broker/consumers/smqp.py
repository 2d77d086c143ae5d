"""The SMQP door: one Channels consumer per TCP connection.

It feeds bytes to the sans-IO codec, dispatches each command to a ``cmd_<name>`` method
(aiosmtpd-style: adding a command is adding a method) and writes the replies. Every rule lives
in :mod:`broker.services`; this class only translates between the wire and those functions.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from channels.exceptions import StopConsumer
from django.conf import settings
from django.utils import timezone

from accounts.models import Account, LoginSession
from broker.consumers.base import DoorConsumer
from broker.delivery import get_dispatcher
from broker.delivery.session import Payload, SubscriberSession
from broker.domain.login import State as LoginState
from broker.services import ServiceError, freshness, notify, publish, read
from broker.services import accounts as account_service
from broker.services import auth as auth_service
from broker.services import removal as removal_service
from broker.services import subscriptions as subscription_service
from broker.services import topics as topic_service
from broker.services.login import (
    AuthChecks,
    Challenge,
    LoggedIn,
    LoginFlow,
    LoginRefused,
    Reason,
    Reproved,
)
from broker.smqp import commands as c
from broker.smqp.connection import CLOSED, NEED_DATA, ServerConnection
from broker.smqp.errors import ProtocolError
from broker.smqp.replies import (
    serialize_get_blocks,
    serialize_greeting,
    serialize_notify_message,
    serialize_notify_server_bye,
    serialize_notify_server_timeout,
    serialize_notify_sub,
    serialize_notify_subscription,
    serialize_notify_topic,
    serialize_reply,
)
from broker.smqp.values import format_datetime, format_keywords, format_smuid_ranges, format_timeout
from broker.store import dbthread
from ual.resolution import snapshot_for

logger = logging.getLogger("broker.smqp")

# Publishes a session parses in one go before other sessions get a turn (see _process).
PUBLISHES_PER_TURN = 32
# Commands a client may send before it has logged in.
BEFORE_LOGIN = (c.Login, c.Pass, c.Noop, c.Quit, c.RawLine)
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
# Topic notifications kept for a session while it has notifications suspended.
MAX_HELD_NOTIFICATIONS = 1000
# Publishes of one session waiting for their commit before the session stops reading: a
# publisher that sends without waiting for replies is held back here (TCP backpressure).
MAX_OUTSTANDING_PUBLISHES = 1024
# NOTIFY SERVER TIMEOUT goes this long before an idle close, or a quarter of the idle timeout
# when that is shorter.
TIMEOUT_NOTICE_SECONDS = 60.0


def _handler_name(command_class: type) -> str:
    return "cmd_" + re.sub(r"(?<!^)(?=[A-Z])", "_", command_class.__name__).lower()


class SMQPConsumer(DoorConsumer):
    """One SMQP session. Its delivery (mailbox, pump, retries, queue-mode locks) is a
    :class:`~broker.delivery.session.SubscriberSession`; this class writes what it sends
    (NOTIFY MESSAGE) and reads the client's ``310 ACK``."""

    logger = logger
    # The client ACKs each message (310 ACK); no ACK by the retry timeout: sent again.
    acks_on_write = False

    # ------------------------------------------------------------------ connection lifecycle

    async def smqp_connect(self, event: dict) -> None:
        self.codec = ServerConnection(
            max_line=settings.SMQP_MAX_LINE, max_message=settings.SMQP_MAX_MESSAGE_BYTES
        )
        client = self.scope.get("client") or ["", 0]
        self.peer_host: str = client[0]
        self.peer = f"{client[0]}:{client[1]}"
        self.account: Account | None = None
        tls = self.scope.get("tls")
        self.login = LoginFlow(
            AuthChecks(self.peer_host, tls["server_cert"] if tls else None),
            methods=auth_service.TLS_METHODS if tls else auth_service.SUPPORTED_METHODS,
            clear_allowed=auth_service.clear_allowed(tls is not None, self.peer_host))
        self.suspended = False
        self._held: list[bytes] = []
        self.closing = False
        # Delivery: the session's mailbox, pump, retries and locks; this door writes what it
        # sends. The login registers this consumer with the dispatcher (it forwards).
        self.delivery = SubscriberSession(self, settings.SMQP_BACKLOG_PAGE, handle=self)
        # Publishes handed to the dispatcher whose replies are still to be written, in order,
        # and the task writing them (the session reads on meanwhile).
        self._outstanding: deque[tuple[asyncio.Future, str]] = deque()
        self._settler: asyncio.Task | None = None
        # SET NOTIFY PORT: the connection notifications go to instead of this one.
        self._notify_writer: asyncio.StreamWriter | None = None
        self._notify_task: asyncio.Task | None = None
        self._out = bytearray()
        # Held while a reply is written in parts (GET MESSAGE), or is not queued yet while
        # the pump may already run (the login's): no notification before it ends.
        self._long_reply = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._ended = False
        self._last_activity = self._loop.time()
        self._watchdog: asyncio.TimerHandle | None = None
        self._arm_watchdog(settings.SMQP_LOGIN_TIMEOUT)
        await self._write(serialize_greeting(f"{settings.SMQP_SERVER_IDENT} {self._context}"))

    async def smqp_receive(self, event: dict) -> None:
        self._last_activity = self._loop.time()
        if self.closing:
            return
        self.codec.receive_data(event["bytes"])
        await self._process()

    async def smqp_shutdown(self, event: dict) -> None:
        """A scheduled shutdown: NOTIFY SERVER TIMEOUT (the grace period) to a session whose
        account asked with SUB SERVER TIMEOUT, then NOTIFY SERVER BYE to every session."""
        grace = int(event.get("grace", 0))
        bye = serialize_notify_server_bye(grace)
        if self.account is not None and self.account_id in await _server_timeout_watchers():
            bye = serialize_notify_server_timeout(grace) + bye
        if self._notify_writer is not None:
            await self._notify(bye)
        await self._write(bye)

    async def smqp_notify(self, event: dict) -> None:
        """A notification for this account from the services (any process)."""
        if self.account is None or self.closing:
            return
        kind = event["kind"]
        if kind == "topic":
            data = serialize_notify_topic(event["topic"], event["action"], event.get("value"))
        elif kind == "sub":
            data = serialize_notify_sub(event["topic"], event["count"])
        elif kind == "server_timeout":
            data = serialize_notify_server_timeout(event["timeout"])
        elif kind == "close":
            # An operator closed this session (the console's sessions page): BYE, and the
            # connection ends; smqp_disconnect then ends the session and releases its locks.
            if self.session is not None and event.get("guid") == self.session.guid:
                self.closing = True
                await self._write(serialize_notify_server_bye(), close=True)
            return
        elif kind == "subscription":
            data = serialize_notify_subscription(event["pattern"], event["action"],
                                                 event["reason"])
        else:
            return
        if self.suspended:
            if len(self._held) < MAX_HELD_NOTIFICATIONS:
                self._held.append(data)
            return
        await self._notify(data)

    async def smqp_disconnect(self, event: dict) -> None:
        await self.end_session()
        raise StopConsumer()

    def stop_door(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._close_notify_channel()
        if self._settler is not None:
            self._settler.cancel()
        for future, _ in self._outstanding:
            # The peer is gone; the publish itself still completes (and is kept).
            future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)

    # ------------------------------------------------------------------------------ plumbing

    @property
    def _context(self) -> str:
        return settings.SMQP_SERVER_CONTEXT

    async def _write(self, data: bytes, *, close: bool = False) -> None:
        self._last_activity = self._loop.time()
        await self.send({"type": "smqp.send", "bytes": data, "close": close})

    def reply(self, code: int, *lines: str) -> None:
        """Queue a reply; replies of one batch of pipelined commands leave in one write."""
        self._out += serialize_reply(code, list(lines))

    async def flush(self, *, close: bool = False) -> None:
        if self._out or close:
            data = bytes(self._out)
            self._out.clear()
            await self._write(data, close=close)

    async def _process(self) -> None:
        codec = self.codec
        started = 0
        while not self.closing:
            event = codec.next_event()
            if event is NEED_DATA:
                break
            if event is CLOSED:
                self.closing = True
                break
            if isinstance(event, ProtocolError):
                await self._settle()
                self.reply(event.code, event.text)
                continue
            if isinstance(event, c.Publish) and self.account is not None:
                self._start_publish(event)
                started += 1
                if started % PUBLISHES_PER_TURN == 0:
                    # A chunk of a publisher's stream may hold hundreds of messages: parsing
                    # them all in one go would hold every other session's turn (a
                    # subscriber's 310 ACK, and so its next NOTIFY) for milliseconds.
                    await asyncio.sleep(0)
                continue
            await self._settle()
            await self._dispatch(event)
        if self.closing or len(self._outstanding) >= MAX_OUTSTANDING_PUBLISHES:
            await self._settle()
        elif self._outstanding and (self._settler is None or self._settler.done()):
            # Their replies go once committed; the next publishes are read meanwhile, so a
            # publisher's stream is not one commit per message.
            self._settler = self.spawn(self._settle_and_flush(), "writing publish replies")
        await self.flush(close=self.closing)

    async def _dispatch(self, command: Any) -> None:
        handler: Callable | None = getattr(self, _handler_name(type(command)), None)
        if self.account is None and not isinstance(command, BEFORE_LOGIN):
            self.reply(401, "Unauthorized (log in first)")
            return
        if handler is None:
            self.reply(501, "Not implemented")
            return
        try:
            # A refusal is given from fresh caches only: the services see to it
            # (broker.services.freshness).
            await handler(command)
        except ServiceError as exc:
            self.reply(exc.code, exc.text)
        except LoginRefused as exc:
            self._login_refused(exc, command)
        except ProtocolError as exc:
            self.reply(exc.code, exc.text)
        except Exception:
            # Never a traceback on the wire; the session stays usable.
            self.failed(f"command {type(command).__name__}")
            self.reply(500, "Server error (nothing was committed)")

    # ------------------------------------------------------------------------------ timeouts

    def _arm_watchdog(self, seconds: float, notice: float = 0.0) -> None:
        """Close the session after ``seconds`` without activity; ``notice`` seconds before
        that, look whether it is to be told (NOTIFY SERVER TIMEOUT)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog_period = seconds
        self._timeout_notice = notice
        self._noticed_activity: float | None = None
        self._watchdog = self._loop.call_later(seconds - notice, self._watchdog_fired)

    def _watchdog_fired(self) -> None:
        period = self._watchdog_period
        remaining = self._last_activity + period - self._loop.time()
        if self.account is None:
            # Before login the clock does not restart on traffic: log in or leave.
            remaining = 0
        if remaining > 0:
            notice = self._timeout_notice
            if remaining > notice:
                delay = remaining - notice
            else:
                delay = remaining
                if self._noticed_activity != self._last_activity:
                    # Once per idle period; the notice itself is no activity of the client's.
                    self._noticed_activity = self._last_activity
                    self._notice_task = asyncio.ensure_future(
                        self._notify_timeout(math.ceil(remaining)))
            self._watchdog = self._loop.call_later(delay, self._watchdog_fired)
            return
        self.closing = True
        reason = "idle" if self.account is not None else "no login"
        self._timeout_task = asyncio.ensure_future(self._close_for_timeout(reason))

    async def _notify_timeout(self, seconds: int) -> None:
        """NOTIFY SERVER TIMEOUT before an idle close, if the account has SUB SERVER TIMEOUT
        (and notifications are not suspended). Written without counting as activity, so
        the close still comes when it was due."""
        try:
            wanted = await dbthread.run(subscription_service.wants_server_timeout,
                                        self.account_id)
        except Exception:  # the close still comes; only the notice is lost
            logger.warning("SUB SERVER TIMEOUT unreadable for %s", self.peer, exc_info=True)
            return
        if (not wanted or self.closing or self.suspended
                or self._noticed_activity != self._last_activity):  # active meanwhile
            return
        await self._notify(serialize_notify_server_timeout(seconds), activity=False)

    async def _close_for_timeout(self, reason: str) -> None:
        self._out += serialize_reply(408, [f"Request timeout ({reason}); closing"])
        await self.flush(close=True)

    # ------------------------------------------------------------------------ login commands

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

    async def _logged_in(self, account: Account, method: str) -> None:
        """Session set-up after a successful login; then the backlog is offered."""
        # Once registered, a wake-up (or the backlog sweep) may start the pump while this
        # still awaits the store: its NOTIFY would reach the client before the login reply
        # (issue 34 item 13). The pump's _notify waits for this lock, then sends the queued
        # reply ahead of the notification.
        async with self._long_reply:
            await self._log_in(account, method)

    async def _log_in(self, account: Account, method: str) -> None:
        session = await dbthread.run(self._begin_session, account, method)
        self.account = account
        self.session = session
        if self.channel_layer is not None:
            await self.channel_layer.group_add(notify.account_group(account.pk),
                                               self.channel_name)
        self.account_id = account.pk
        self.dispatcher = get_dispatcher()
        self.dispatcher.register(self)
        await self.dispatcher.joined()  # wake-ups from other processes reach us from here on
        await self._read_backlog()
        idle = settings.SMQP_IDLE_TIMEOUT
        self._arm_watchdog(idle, notice=min(TIMEOUT_NOTICE_SECONDS, idle / 4))
        self.reply(
            200,
            "OK",
            f"Topic: {account.account_topic_path}",
            f"Timeout: {format_timeout(settings.SMQP_DEFAULT_TIMEOUT)}",
            f"Time: {format_datetime(timezone.now())}",
            # The limits this server enforces (draft 5.1 item 6).
            f"Max-Message-Size: {settings.SMQP_MAX_MESSAGE_BYTES}",
            f"Max-Subscriptions: {settings.SMQP_MAX_SUBSCRIPTIONS_PER_ACCOUNT}",
            f"Max-Window: {settings.SMQP_MAX_NOTIFY_WINDOW}",  # profile §9.7
            f"Guid: {session.guid}",
        )

    def _begin_session(self, account: Account, method: str) -> LoginSession:
        # A session sees every change committed before it logged in (a UAL edit, a topic
        # made or removed by another process), not only after this process's next poll of
        # the shared generations (SMQP_CACHE_POLL_SECONDS): they are read now.
        freshness.caches_were_stale()
        return auth_service.begin_session(account, peer=self.peer, method=method)

    # ------------------------------------------------------------------------ session commands

    async def cmd_noop(self, cmd: c.Noop) -> None:
        self.reply(200, "OK")

    async def cmd_quit(self, cmd: c.Quit) -> None:
        self.reply(200, "OK")
        self.closing = True

    # ------------------------------------------------------------------------ topic commands

    async def _call(self, fn: Callable, *args: Any) -> Any:
        """Run a service function in the database thread."""
        return await dbthread.run(fn, *args)

    async def _as_account(self, fn: Callable, *args: Any) -> Any:
        """Run a service function with this account's access snapshot (cached per process,
        rebuilt after any change that can alter a decision)."""

        def run() -> Any:
            return fn(snapshot_for(self.account), *args)

        return await dbthread.run(run)

    def reply_list(self, items: list[str], empty: str) -> None:
        self.reply(200, "OK", *(items or [empty]))

    async def cmd_count(self, cmd: c.Count) -> None:
        fn = {"TOPIC": topic_service.count_topics, "MESSAGE": topic_service.count_messages,
              "SUBSCRIBERS": topic_service.count_subscribers}[cmd.resource]
        self.reply(200, "OK", str(await self._as_account(fn, cmd.pattern)))

    async def cmd_list_topic(self, cmd: c.ListTopic) -> None:
        found = await self._as_account(topic_service.children, cmd.topic)
        self.reply_list([str(t) for t in found], "0 topics")

    async def cmd_list_message(self, cmd: c.ListMessage) -> None:
        smuids = await self._as_account(topic_service.list_messages, cmd.topic)
        self.reply(200, "OK", format_smuid_ranges(smuids) if smuids else "none")

    async def cmd_create_topic(self, cmd: c.CreateTopic) -> None:
        await self._as_account(topic_service.create_topic, cmd.topic, cmd.keywords, cmd.link)
        self.reply(200, "OK")

    async def cmd_remove_topic(self, cmd: c.RemoveTopic) -> None:
        pending = await self._as_account(topic_service.remove_topic, cmd.topic)
        self.reply(200, "OK", f"{pending} messages pending")

    async def cmd_remove_message(self, cmd: c.RemoveMessage) -> None:
        await self._as_account(removal_service.remove_messages, cmd.topic, cmd.smuids)
        self.reply(200, "OK")

    async def cmd_set_topic_name(self, cmd: c.SetTopicName) -> None:
        await self._as_account(topic_service.rename_topic, cmd.topic, cmd.new_topic)
        self.reply(200, "OK")

    async def cmd_set_topic_keywords(self, cmd: c.SetTopicKeywords) -> None:
        await self._as_account(topic_service.set_keywords, cmd.topic, cmd.keywords)
        self.reply(200, "OK")

    async def cmd_get_topic_keywords(self, cmd: c.GetTopicKeywords) -> None:
        keywords = await self._as_account(topic_service.get_keywords, cmd.topic)
        self.reply(200, "OK", ",".join(keywords))

    async def cmd_find_topic(self, cmd: c.FindTopic) -> None:
        found = await self._as_account(topic_service.find_topics, cmd.pattern, cmd.keywords)
        self.reply_list([f"{t.path} {format_keywords(kws)}" for t, kws in found], "0 topics")

    # ------------------------------------------------------------------------ login details

    async def cmd_set_login(self, cmd: c.SetLogin) -> None:
        if cmd.field == "PASSWORD":
            self.login.change_password(cmd.value.partition("/")[0])
            if self.login.scram_expected:  # the old password proved first
                self.reply(200, "OK", "+ ")
                self.codec.expect_raw_line()
                return
            self.reply(200, "OK")  # PASS <old> <new> next
            return
        await self._call(account_service.set_detail, self.account, cmd.field, cmd.value)
        self.reply(200, "OK")

    # ------------------------------------------------------------------------ subscriptions

    async def cmd_subscribe(self, cmd: c.Subscribe) -> None:
        covered = await self._as_account(
            subscription_service.subscribe, cmd.resource, cmd.pattern, cmd.since, cmd.lease,
            cmd.selector)
        if cmd.resource == "SERVER":
            covered = ["SERVER TIMEOUT"]
        self.reply(200, "OK", *covered)
        if cmd.resource == "MESSAGE":
            await self._read_backlog()

    async def cmd_unsubscribe(self, cmd: c.Unsubscribe) -> None:
        removed = await self._as_account(
            subscription_service.unsubscribe, cmd.resource, cmd.pattern, cmd.selector)
        self.reply(200, "OK", *(f"{res} {pattern}" if res != "SERVER" else "SERVER TIMEOUT"
                                for res, pattern in removed))

    # ------------------------------------------------------------------------ notify control

    async def cmd_set_notify_suspend(self, cmd: c.SetNotifySuspend) -> None:
        self.suspended = True
        self.reply(200, "OK")

    async def cmd_set_notify_window(self, cmd: c.SetNotifyWindow) -> None:
        """Profile §9.7: up to n NOTIFY MESSAGEs unacknowledged at once; those it lets go
        now leave in the write of this 200 OK."""
        more = self.delivery.set_window(read.delivery_window(cmd.window))
        self.reply(200, "OK")
        if more:
            await self.delivery.pump_here()

    async def cmd_set_notify_resume(self, cmd: c.SetNotifyResume) -> None:
        # The draft: RESUME without a SUSPEND is ignored (and still answered).
        self.suspended = False
        self.reply(200, "OK")
        held, self._held = self._held, []
        if held:
            await self.flush()
            await self._notify(b"".join(held))
        self.kick()

    # ------------------------------------------------------------------------ publishing

    def _start_publish(self, cmd: c.Publish) -> None:
        """Hand the message to the dispatcher's next group commit without waiting, so that
        pipelined publishes share a transaction; the reply is written once it committed."""
        request = publish.PublishRequest(
            account_id=self.account_id, guid=self.session.guid if self.session else "",
            kind=cmd.kind, topic=cmd.topic, cmuid=cmd.cmuid, message=cmd.message, peer=self.peer)
        self._outstanding.append((self.dispatcher.publish(request), cmd.cmuid))

    async def _settle(self) -> None:
        """Write the replies of outstanding publishes, in order (after their commit): before
        any other reply, those of the publishes before it."""
        if self._settler is not None and not self._settler.done():
            await asyncio.shield(self._settler)  # it writes them all; no publish comes meanwhile
        await self._write_replies()

    async def _settle_and_flush(self) -> None:
        """The settler: replies of the publishes as they commit, including those read
        while it runs, each group written as soon as it is there."""
        while self._outstanding:
            await self._write_replies()
            await self.flush()

    async def _write_replies(self) -> None:
        while self._outstanding:
            future, cmuid = self._outstanding[0]
            try:
                published = await future
            except ServiceError as exc:
                self.reply(exc.code, exc.text)
            except ProtocolError as exc:
                self.reply(exc.code, exc.text)
            except Exception:
                self.failed("publish")
                self.reply(500, "Server error (nothing was committed)")
            else:
                self.reply(200, "OK", f"{cmuid} {published.smuid}")
            self._outstanding.popleft()

    async def cmd_republish(self, cmd: c.Republish) -> None:
        await self._as_account(publish.republish, cmd.topic, cmd.smuid)  # announces itself
        self.reply(200, "OK")

    async def cmd_get_message(self, cmd: c.GetMessage) -> None:
        """Written a page at a time; notifications wait until the whole reply is out."""
        ctx = self._context
        sent = after = 0
        async with self._long_reply:
            while True:
                try:
                    found = await self._as_account(
                        read.get_messages, cmd.topic, cmd.smuids, after)
                except Exception:
                    if not sent:
                        raise  # nothing written yet: an error reply as for any command
                    # Half way through (the right revoked, say): end with what was sent.
                    logger.warning("GET MESSAGE %s stopped after %d messages for %s",
                                   cmd.topic, sent, self.peer, exc_info=True)
                    break
                if not sent:
                    self._out += b"200-OK\r\n"
                if not found:
                    break
                self._out += serialize_get_blocks(
                    [(topic, f"{ctx}/{smuid}", cmuid, msg) for topic, smuid, cmuid, msg in found])
                sent += len(found)
                after = found[-1][1]
                await self.flush()
            self._out += f"200 {sent} messages\r\n".encode()

    # ------------------------------------------------------------------------ delivery

    async def _read_backlog(self) -> None:
        await self.delivery.read_backlog()

    def may_send(self) -> bool:
        return not self.suspended

    def queue_credit(self, topic: str) -> int | None:
        return None  # the window (SET NOTIFY WINDOW) is the limit

    async def write_message(self, smuid: int, payload: Payload) -> bool:
        topic, cmuid, msg = payload
        return await self._notify(
            serialize_notify_message(topic, f"{self._context}/{smuid}", cmuid, msg))

    async def locks_expired(self, held: list) -> None:
        pass  # (locks here end with their message in flight: the client's answer is refused)

    async def cmd_ack(self, cmd: c.Ack) -> None:
        try:
            recorded = await self.delivery.ack_inflight(cmd.smuid)
        except ServiceError as exc:
            if exc.code != 409:
                raise
            # Queue mode, the lock lost (or no such message in flight): refused, and the
            # next message goes all the same.
            self.reply(exc.code, exc.text)
        else:
            if not recorded:
                self.reply(400, "Bad request (no message is waiting for 310 ACK)")
                return
            self.reply(310, "ACK")
        # The next NOTIFY leaves in the same write as this 310 ACK (one packet, one wake-up
        # of the client instead of two), sent from here rather than from a task of its own
        # (two event-loop steps less per message).
        await self.delivery.pump_here()
        await self.flush()

    # ------------------------------------------------------------------ SET NOTIFY PORT

    async def cmd_set_notify_port(self, cmd: c.SetNotifyPort) -> None:
        """Connect back to the client's own address on ``port`` before replying (408 when
        that fails); from then on notifications go there, and 310 ACKs are read there."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.peer_host, cmd.port),
                settings.SMQP_NOTIFY_CONNECT_TIMEOUT)
        except (TimeoutError, OSError):
            self.reply(408, f"Request timeout (cannot connect to port {cmd.port})")
            return
        self._close_notify_channel()
        self._notify_writer = writer
        self._notify_task = asyncio.ensure_future(self._read_notify_channel(reader, writer))
        self.reply(200, "OK")

    async def _read_notify_channel(self, reader: asyncio.StreamReader,
                                   writer: asyncio.StreamWriter) -> None:
        try:
            while not self.closing:
                line = await reader.readline()
                if not line:
                    break
                text = line.strip().upper()
                if not text:
                    continue
                if writer.is_closing():
                    break
                ack = _notify_channel_ack(text)
                if isinstance(ack, ProtocolError):
                    writer.write(f"{ack.code} {ack.text}\r\n".encode())
                elif ack is not None:
                    try:
                        recorded = await self.delivery.ack_inflight(ack.smuid)
                    except ServiceError as exc:
                        writer.write(f"{exc.code} {exc.text}\r\n".encode())
                        if exc.code == 409:  # queue mode, the lock lost: the next one goes
                            self.kick()
                    else:
                        if recorded:
                            writer.write(b"310 ACK\r\n")
                            self.kick()
                        else:
                            writer.write(
                                b"400 Bad request (no message is waiting for 310 ACK)\r\n")
                else:
                    writer.write(b"400 Bad request (only 310 ACK is read on this connection)\r\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if self._notify_writer is writer:
                # The client's listener went away: notifications return to the session.
                self._notify_writer = None
                self.kick()
            writer.close()

    def _close_notify_channel(self) -> None:
        if self._notify_writer is not None:
            self._notify_writer.close()
            self._notify_writer = None
        if self._notify_task is not None:
            self._notify_task.cancel()
            self._notify_task = None

    async def _notify(self, data: bytes, *, activity: bool = True) -> bool:
        """Write a notification: to the SET NOTIFY PORT connection when there is one; False
        when that connection is gone. ``activity``: it restarts the idle clock (not a notice
        of that clock running out)."""
        writer = self._notify_writer
        if writer is None:
            while self._long_reply.locked():
                async with self._long_reply:
                    pass
            if self._out:  # replies already due go first; never split one
                data = bytes(self._out) + data
                self._out.clear()
            if activity:
                await self._write(data)
            else:
                await self.send({"type": "smqp.send", "bytes": data, "close": False})
            return True
        if activity:
            self._last_activity = self._loop.time()
        if writer.is_closing():  # gone: the retry timer sends the notification again
            self._close_notify_channel()
            return False
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            self._close_notify_channel()
            return False
        return True

def _notify_channel_ack(line: bytes) -> c.Ack | ProtocolError | None:
    """A line read on the SET NOTIFY PORT connection: the ``310 ACK [<smuid>]`` it holds, its
    refusal when malformed, None when it is something else."""
    if line != b"310 ACK" and not line.startswith(b"310 ACK "):
        return None
    try:
        command = c.parse_command_line(line.decode("ascii"))
    except (ProtocolError, UnicodeDecodeError) as exc:
        return exc if isinstance(exc, ProtocolError) else ProtocolError(400, "Bad request")
    return command if isinstance(command, c.Ack) else None


_watchers: tuple[float, asyncio.Future] | None = None


async def _server_timeout_watchers() -> set[int]:
    """Accounts with SUB SERVER TIMEOUT, read once for all the sessions of this process that
    ask within a second (a shutdown asks for every session at once); none if unreadable."""
    global _watchers
    loop = asyncio.get_running_loop()
    if _watchers is None or _watchers[0] < loop.time() or _watchers[1].get_loop() is not loop:
        _watchers = (loop.time() + 1.0, asyncio.ensure_future(dbthread.run(
            lambda: set(subscription_service.server_timeout_watchers()))))
    try:
        return await asyncio.shield(_watchers[1])
    except Exception:
        logger.warning("SUB SERVER TIMEOUT subscribers unreadable", exc_info=True)
        return set()

