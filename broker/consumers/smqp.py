"""The SMQP door: one Channels consumer per TCP connection.

It feeds bytes to the sans-IO codec, dispatches each command to a ``cmd_<name>`` method
(aiosmtpd-style: adding a command is adding a method) and writes the replies. Every rule lives
in :mod:`broker.services`; this class only translates between the wire and those functions.
Delivery is the session's (:mod:`broker.delivery.session`); the login commands
(:mod:`.smqp_login`), the topic and message commands and the publish replies
(:mod:`.smqp_commands`), the NOTIFY lines of account notifications (:mod:`.smqp_notices`),
SET NOTIFY PORT's connection (:mod:`.smqp_notify_port`) and the idle clock (:mod:`.idle`)
are modules of their own.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from channels.exceptions import StopConsumer
from django.conf import settings
from django.utils import timezone

from accounts.models import Account, LoginSession
from broker.consumers.base import DoorConsumer
from broker.consumers.idle import IdleWatchdog
from broker.consumers.smqp_commands import PublishReplies, TopicCommands
from broker.consumers.smqp_login import LoginCommands
from broker.consumers.smqp_notices import notification, server_timeout_watchers
from broker.consumers.smqp_notify_port import AckAnswer, NotifyPort
from broker.delivery import get_dispatcher
from broker.delivery.session import Payload, SubscriberSession
from broker.services import ServiceError, freshness, notify, read
from broker.services import auth as auth_service
from broker.services import subscriptions as subscription_service
from broker.services.login import AuthChecks, LoginFlow, LoginRefused
from broker.smqp import commands as c
from broker.smqp.connection import CLOSED, NEED_DATA, ServerConnection
from broker.smqp.errors import ProtocolError
from broker.smqp.replies import (
    serialize_greeting,
    serialize_notify_message,
    serialize_notify_server_bye,
    serialize_notify_server_timeout,
    serialize_reply,
)
from broker.smqp.values import format_datetime, format_timeout
from broker.store import dbthread

logger = logging.getLogger("broker.smqp")

# Publishes a session parses in one go before other sessions get a turn (see _process).
PUBLISHES_PER_TURN = 32
# Commands a client may send before it has logged in.
BEFORE_LOGIN = (c.Login, c.Pass, c.Noop, c.Quit, c.RawLine)
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


class SMQPConsumer(LoginCommands, TopicCommands, PublishReplies, DoorConsumer):
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
        self._notify_port: NotifyPort | None = None
        self._out = bytearray()
        # Held while a reply is written in parts (GET MESSAGE), or is not queued yet while
        # the pump may already run (the login's): no notification before it ends.
        self._long_reply = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._ended = False
        self._watchdog = IdleWatchdog(self._loop, restarts=lambda: self.account is not None,
                                      notice=self._idle_notice, expire=self._idle_expired)
        self._watchdog.arm(settings.SMQP_LOGIN_TIMEOUT)
        await self._write(serialize_greeting(f"{settings.SMQP_SERVER_IDENT} {self._context}"))

    async def smqp_receive(self, event: dict) -> None:
        self._watchdog.touch()
        if self.closing:
            return
        self.codec.receive_data(event["bytes"])
        await self._process()

    async def smqp_shutdown(self, event: dict) -> None:
        """A scheduled shutdown: NOTIFY SERVER TIMEOUT (the grace period) to a session whose
        account asked with SUB SERVER TIMEOUT, then NOTIFY SERVER BYE to every session."""
        grace = int(event.get("grace", 0))
        bye = serialize_notify_server_bye(grace)
        if self.account is not None and self.account_id in await server_timeout_watchers():
            bye = serialize_notify_server_timeout(grace) + bye
        if self._notify_port is not None:
            await self._notify(bye)
        await self._write(bye)

    async def smqp_notify(self, event: dict) -> None:
        """A notification for this account from the services (any process)."""
        if self.account is None or self.closing:
            return
        if event["kind"] == "close":
            # An operator closed this session (the console's sessions page): BYE, and the
            # connection ends; smqp_disconnect then ends the session and releases its locks.
            if self.session is not None and event.get("guid") == self.session.guid:
                self.closing = True
                await self._write(serialize_notify_server_bye(), close=True)
            return
        data = notification(event)
        if data is None:
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
        self._watchdog.cancel()
        self._close_notify_port()
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
        self._watchdog.touch()
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

    def _idle_notice(self, seconds: int) -> None:
        self._notice_task = asyncio.ensure_future(self._notify_timeout(seconds))

    def _idle_expired(self) -> None:
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
                or self._watchdog.active_since_notice):  # active meanwhile
            return
        await self._notify(serialize_notify_server_timeout(seconds), activity=False)

    async def _close_for_timeout(self, reason: str) -> None:
        # Logged: a client told 408 otherwise leaves no trace of why its session ended.
        who = self.account.username if self.account is not None else "not logged in"
        logger.info("%s (%s): closing, %s timeout", self.peer, who, reason)
        self._out += serialize_reply(408, [f"Request timeout ({reason}); closing"])
        await self.flush(close=True)

    # ------------------------------------------------------------------------ login commands

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
        self._watchdog.arm(idle, notice=min(TIMEOUT_NOTICE_SECONDS, idle / 4))
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

    async def answer_ack(self, smuid: int | None = None) -> AckAnswer:
        """The client's ``310 ACK [<smuid>]`` (on this connection or its SET NOTIFY PORT
        one), recorded: the reply, and whether the next message may go now. A refusal other
        than the lost lock (or no such message) is raised, for the door's funnel."""
        try:
            recorded = await self.delivery.ack_inflight(smuid)
        except ServiceError as exc:
            if exc.code != 409:
                raise
            # Queue mode, the lock lost (or no such message in flight): refused, and the
            # next message goes all the same.
            return exc.code, exc.text, True
        if not recorded:
            return 400, "Bad request (no message is waiting for 310 ACK)", False
        return 310, "ACK", True

    async def cmd_ack(self, cmd: c.Ack) -> None:
        code, text, next_may_go = await self.answer_ack(cmd.smuid)
        self.reply(code, text)
        if not next_may_go:
            return
        # The next NOTIFY leaves in the same write as this 310 ACK (one packet, one wake-up
        # of the client instead of two), sent from here rather than from a task of its own
        # (two event-loop steps less per message).
        await self.delivery.pump_here()
        await self.flush()

    # ------------------------------------------------------------------ SET NOTIFY PORT

    async def cmd_set_notify_port(self, cmd: c.SetNotifyPort) -> None:
        """Connect back to the client's own address on ``port`` before replying (408 when
        that fails); from then on notifications go there, and 310 ACKs are read there."""
        port = await NotifyPort.connect(
            self.peer_host, cmd.port, settings.SMQP_NOTIFY_CONNECT_TIMEOUT,
            answer_ack=self.answer_ack, next_may_go=self.kick, gone=self._notify_port_gone,
            closing=lambda: self.closing)
        if port is None:
            self.reply(408, f"Request timeout (cannot connect to port {cmd.port})")
            return
        self._close_notify_port()
        self._notify_port = port
        self.reply(200, "OK")

    def _notify_port_gone(self, port: NotifyPort) -> None:
        if self._notify_port is port:  # the client's listener went away, not replaced
            self._notify_port = None
            self.kick()  # notifications return to the session

    def _close_notify_port(self) -> None:
        port, self._notify_port = self._notify_port, None
        if port is not None:
            port.close()

    async def _notify(self, data: bytes, *, activity: bool = True) -> bool:
        """Write a notification: to the SET NOTIFY PORT connection when there is one; False
        when that connection is gone. ``activity``: it restarts the idle clock (not a notice
        of that clock running out)."""
        port = self._notify_port
        if port is None:
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
            self._watchdog.touch()
        if not await port.write(data):
            self._close_notify_port()
            return False
        return True
