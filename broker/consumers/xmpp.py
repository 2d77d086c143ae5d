"""The XMPP door (XMPP-PROFILE.md): one Channels consumer per WebSocket connection at
``/xmpp-websocket`` (subprotocol ``xmpp``), served by Daphne.

Each text frame goes to the sans-IO stream (:mod:`broker.xmpp.stream`); each IQ is parsed
into a command (:mod:`broker.xmpp.stanzas`) and handled by an ``iq_<command>`` method
(aiosmtpd-style, as the SMQP door). Every rule is a service's: publish, subscribe, locks, ACK
and reads go through the same :mod:`broker.services` and dispatcher as SMQP's, so an item
published at either door reaches subscribers at both, and queue workers at both compete for
the same items.

Delivery: the session keeps a :class:`~broker.delivery.Mailbox` like an SMQP session. On a
fan-out node a message counts as delivered once written (it is ACKed at once). On a queue
node each item is locked to this session before it goes (SMQP-PROFILE §9.6) and stays
locked until the client retracts (consumes) or unlocks it, its lock times out, the client
sends unavailable presence, or the stream ends; up to ``pubsub#queue_requests`` locks per
node at a time (the in-flight slot of the mailbox is freed as soon as the item is written;
the lock stays in the mailbox's lock table).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from accounts.models import Account, LoginSession
from accounts.scram import ScramError, ScramServer
from broker.delivery import NEED_PAGE, Dispatcher, Mailbox, get_dispatcher
from broker.domain.values import TopicPattern
from broker.services import ServiceError, freshness, notify, publish, read
from broker.services import ack as ack_service
from broker.services import auth as auth_service
from broker.services import pubsub as pubsub_service
from broker.services import subscriptions as subscription_service
from broker.services import topics as topic_service
from broker.services.deliveries import NO_PRIORITY
from broker.services.selectors import SelectorError
from broker.store import dbthread
from broker.xmpp import payload as xpayload
from broker.xmpp import stanzas as s
from broker.xmpp import stream as xs
from broker.xmpp.xml import escape_attr
from ual.resolution import snapshot_for

logger = logging.getLogger("broker.xmpp")

SUBPROTOCOL = "xmpp"
# Items a session remembers having received (for XEP-0254's unexpected-request vs
# forbidden): the most recent ones.
RECEIVED_MEMORY = 10_000
# After the server's <close/>, how long the client has to close the WebSocket itself.
CLOSE_GRACE_SECONDS = 5.0
# Publishes of one session waiting for their commit before it stops reading.
MAX_OUTSTANDING_PUBLISHES = 1024
# ServiceError codes (SMQP's) → XMPP stanza error conditions.
CONDITIONS = {400: "bad-request", 401: "forbidden", 403: "forbidden", 404: "item-not-found",
              405: "not-allowed", 409: "conflict", 414: "not-acceptable",
              510: "resource-constraint"}
RESOURCE_OK = re.compile(r"^[^\s/@<>&'\"]{1,64}$")


def _handler_name(command: Any) -> str:
    return "iq_" + re.sub(r"(?<!^)(?=[A-Z])", "_", type(command).__name__).lower()


def _fault(exc: ServiceError) -> s.IqFault:
    if isinstance(exc, pubsub_service.OptionsRequired):
        return s.IqFault("not-acceptable", "configuration-required")
    if isinstance(exc, SelectorError):
        # XEP-0060 §6.3.5: options that cannot be accepted are bad-request + invalid-options;
        # the text keeps SMQP's code and column (566 / 567, profile §9.2).
        return s.IqFault("bad-request", "invalid-options", text=f"{exc.code} {exc.text}")
    condition = CONDITIONS.get(exc.code, "internal-server-error" if exc.code >= 500
                               else "bad-request")
    pubsub = "payload-too-big" if exc.code == 414 else None
    return s.IqFault(condition, pubsub, text=exc.text)


@dataclass(slots=True)
class Held:
    """An item locked to this session (queue node)."""

    node: str
    item_id: str


class XMPPConsumer(AsyncConsumer):
    """One XMPP stream over one WebSocket."""

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        """As :class:`broker.consumers.smqp.SMQPConsumer`: the connection's events awaited
        directly, the channel layer's in a task of their own, one handler at a time."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        self._turn = asyncio.Lock()
        layer_events: asyncio.Task | None = None
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            self.channel_receive = functools.partial(self.channel_layer.receive,
                                                     self.channel_name)
            layer_events = asyncio.ensure_future(self._layer_events())
        try:
            while True:
                event = await receive()
                async with self._turn:
                    await self.dispatch(event)
        except StopConsumer:
            pass
        finally:
            if layer_events is not None:
                layer_events.cancel()
            # Whatever ended the loop (the disconnect, an exception, the server cancelling
            # this instance), the session ends with it: never a live session without its
            # transport. Shielded: a cancelled instance still releases its locks.
            if getattr(self, "stream", None) is not None:
                await asyncio.shield(self._end_session())

    async def _layer_events(self) -> None:
        while True:
            event = await self.channel_receive()
            async with self._turn:
                try:
                    await self.dispatch(event)
                except Exception:
                    logger.exception("channel layer event %s failed", event.get("type"))

    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is not None:
            await handler(message)

    # ------------------------------------------------------------------ connection

    async def websocket_connect(self, event: dict) -> None:
        if SUBPROTOCOL not in (self.scope.get("subprotocols") or []):
            # RFC 7395 §3.2: without the xmpp subprotocol there is no XMPP stream.
            await self.send({"type": "websocket.close", "code": 1002})
            raise StopConsumer()
        client = self.scope.get("client") or ["", 0]
        self.peer_host: str = client[0]
        self.peer = f"{client[0]}:{client[1]}"
        self.domain: str = settings.SMQP_XMPP_DOMAIN
        self.service_jid = f"pubsub.{self.domain}"
        tls = self.scope.get("scheme") == "wss"
        mechanisms = ["SCRAM-SHA-256"]
        if auth_service.xmpp_plain_allowed(tls, self.peer_host):
            mechanisms.append("PLAIN")
        self.stream = xs.ServerStream(self.domain, settings.SMQP_XMPP_MAX_FRAME, mechanisms)
        self.closing = False
        self._held_frames: list[str] | None = None
        self._disconnected = False
        self._ended = False
        self._acks_after_flush: list[ack_service.AckRequest] = []
        self.authenticated: Account | None = None
        self.account: Account | None = None
        self.account_id = 0
        self.session: LoginSession | None = None
        self.jid = ""
        self.scram: ScramServer | None = None
        self.plain_pending = False
        self.dispatcher: Dispatcher | None = None
        self.mailbox = Mailbox(settings.SMQP_BACKLOG_PAGE)
        self.available = True
        self._pump_task: asyncio.Task | None = None
        self._pumping = False
        self._tasks: set[asyncio.Future] = set()
        self._outstanding = 0
        # Queue nodes: queue_requests per node key, locks held, items put aside while their
        # node is at its limit, and the items received lately.
        self.queue_requests: dict[str, int] = {}
        self.held: dict[int, Held] = {}
        self.held_by_id: dict[tuple[str, str], int] = {}
        # Locked (or being locked) here and not yet written to the transport: if the stream
        # ends first, their release gives back the attempt the lock counted.
        self.unsent: set[int] = set()
        # Of those, the ones whose frame waits in _held_frames (its index there): sent, and
        # so no longer unsent, only once _flush has written that frame.
        self._unsent_held: dict[int, int] = {}
        self.parked: defaultdict[str, set[tuple[int, int]]] = defaultdict(set)
        self.received: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._loop = asyncio.get_running_loop()
        self._lock_timer: asyncio.TimerHandle | None = None
        self._login_timer = self._loop.call_later(settings.SMQP_LOGIN_TIMEOUT,
                                                  self._login_timed_out)
        await self.send({"type": "websocket.accept", "subprotocol": SUBPROTOCOL})

    async def websocket_receive(self, event: dict) -> None:
        if self.closing:
            return
        frame = event.get("text")
        if frame is None:
            frame = event.get("bytes") or b""
        try:
            await self._frame(frame)
        except Exception:
            # Never a traceback on the wire and never a dead process: this stream ends.
            logger.exception("XMPP frame failed for %s", self.peer)
            await self._stream_error("internal-server-error")

    async def websocket_disconnect(self, event: dict) -> None:
        self._disconnected = True
        # Shielded: Daphne cancels an instance still running 10 s after the disconnect
        # (application_close_timeout), as a busy database thread can make this; cancelled
        # here, _end_session had set _ended and the session stayed live for good.
        await asyncio.shield(self._end_session())
        raise StopConsumer()

    async def _end_session(self) -> None:
        """The transport ended: the session ends, its locks go back, once."""
        if self._ended:
            return
        self._ended = True
        self.closing = True
        self._login_timer.cancel()
        if self._lock_timer is not None:
            self._lock_timer.cancel()
        if self.dispatcher is not None:
            self.dispatcher.unregister(self)
        if self._pump_task is not None:
            self._pump_task.cancel()
        if self.account is not None and self.channel_layer is not None:
            try:
                await self.channel_layer.group_discard(notify.account_group(self.account_id),
                                                       self.channel_name)
            except Exception:  # the group expires in Redis; the session must still end
                logger.warning("leaving the account group failed for %s", self.peer,
                               exc_info=True)
        if self.session is not None:
            session, self.session = self.session, None
            if self.held or self._took_locks:
                try:
                    await self.dispatcher.release(self.account_id, session.guid,
                                                  unsent=self.unsent)
                except Exception:  # the lock sweep ends them
                    logger.exception("releasing the locks of %s failed", session.guid)
            await dbthread.run(auth_service.end_session, session)

    def _count_out(self) -> None:
        """One message sent to this session (the operators' sessions list)."""
        self.dispatcher.metrics.session(self.session.guid if self.session else None, "out")

    async def _write(self, text: str) -> bool:
        """Hand a frame to the transport (or hold it for this stanza's flush); False when
        it cannot go any more (the stream is closing, the transport is gone)."""
        if self.closing:
            return False
        if self._held_frames is not None:
            self._held_frames.append(text)
            return True
        return await self._send_frame(text)

    async def _send_frame(self, text: str) -> bool:
        if self._disconnected:
            return False
        try:
            await self.send({"type": "websocket.send", "text": text})
        except Exception:
            # The peer closed the WebSocket under us (Daphne raises autobahn's
            # Disconnected; other servers their own error): an ordinary end, no traceback.
            # websocket.disconnect follows, or the consumer's loop ends; either ends the
            # session.
            logger.debug("XMPP transport of %s closed while sending", self.peer)
            self._disconnected = True
            self.closing = True
            return False
        return True

    async def _flush(self) -> None:
        """Send the frames held while a stanza was handled, one after the other in one go:
        Daphne's transport then writes them in one segment. Frames sent apart wait for the
        peer's delayed ACK (Nagle: Daphne's sockets have no TCP_NODELAY), 40 ms a time.
        Fan-out deliveries written meanwhile are ACKed once their frames went."""
        held, self._held_frames = self._held_frames, None
        acks, self._acks_after_flush = self._acks_after_flush, []
        unsent_held, self._unsent_held = self._unsent_held, {}
        for index, text in enumerate(held or ()):
            if not await self._send_frame(text):
                return
            self.unsent.discard(unsent_held.get(index, 0))
        for request in acks:
            await self.dispatcher.ack(request, self)

    async def _stream_error(self, condition: str, text: str = "") -> None:
        """End the stream: the stream error and ``<close/>``; the client closes the
        WebSocket (RFC 7395 §3.6), or the server does after :data:`CLOSE_GRACE_SECONDS`."""
        if self.closing:
            return
        self.stream.fail()
        await self._write(s.stream_error(condition, text))
        await self._end_stream()

    async def _end_stream(self) -> None:
        await self._write(s.close_frame())
        self.closing = True
        self._loop.call_later(CLOSE_GRACE_SECONDS, self._close_socket)

    def _close_socket(self) -> None:
        if not self._disconnected:
            self._spawn(self._close_transport())

    async def _close_transport(self) -> None:
        try:
            await self.send({"type": "websocket.close", "code": 1000})
        except Exception:  # closed by the peer meanwhile
            self._disconnected = True

    def _login_timed_out(self) -> None:
        if self.session is None and not self.closing:
            self._spawn(self._stream_error("connection-timeout", "no login in time"))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("XMPP task failed for %s", self.peer, exc_info=task.exception())

    # ------------------------------------------------------------------ frames

    async def _frame(self, frame: str | bytes) -> None:
        event = self.stream.receive(frame)
        if event is None:
            return
        if isinstance(event, xs.Fault):
            await self._stream_error(event.condition, event.text)
        elif isinstance(event, xs.Closed):
            await self._end_stream()
        elif isinstance(event, xs.Opened):
            for text in event.frames:
                await self._write(text)
        elif isinstance(event, xs.SaslFault):
            self._reset_auth()
            await self._write(s.sasl_failure(event.condition))
        elif isinstance(event, xs.AuthAbort):
            self._reset_auth()
            await self._write(s.sasl_failure("aborted"))
        elif isinstance(event, xs.AuthStart):
            await self._auth_start(event)
        elif isinstance(event, xs.AuthResponse):
            await self._auth_response(event.data)
        elif isinstance(event, xs.Stanza):
            self._held_frames = []
            try:
                await self._stanza(event)
            finally:
                await self._flush()

    # ------------------------------------------------------------------ SASL

    def _reset_auth(self) -> None:
        self.scram = None
        self.plain_pending = False
        self.stream.sasl_failed()

    async def _auth_failed(self, username: str, condition: str = "not-authorized",
                           record: bool = True) -> None:
        self._reset_auth()
        if record:
            await dbthread.run(auth_service.record_failure, self.peer_host, username)
        await self._write(s.sasl_failure(condition))

    async def _refused(self, username: str) -> float | None:
        """Count this attempt (before any password check): None if it is refused (the
        failure is sent), else the delay to wait first."""
        throttle = await auth_service.admit_attempt(self.peer_host, username)
        if not throttle.refused:
            return throttle.delay
        self._reset_auth()
        await self._write(s.sasl_failure("temporary-auth-failure",
                                         "too many failed logins; try again later"))
        return None

    async def _auth_start(self, event: xs.AuthStart) -> None:
        if event.mechanism == "PLAIN":
            if event.initial is None:
                self.plain_pending = True
                await self._write(s.sasl_challenge(b""))
                return
            await self._plain(event.initial)
            return
        self.scram = auth_service.scram_server(None)
        if event.initial is None:
            await self._write(s.sasl_challenge(b""))
            return
        await self._scram_step(event.initial)

    async def _auth_response(self, data: bytes) -> None:
        if self.plain_pending:
            self.plain_pending = False
            await self._plain(data)
        elif self.scram is not None:
            await self._scram_step(data)
        else:
            self._reset_auth()
            await self._write(s.sasl_failure("aborted"))

    async def _plain(self, data: bytes) -> None:
        parts = data.split(b"\0")
        if len(parts) != 3:
            await self._auth_failed("", "malformed-request", record=False)
            return
        try:
            authzid, username, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            await self._auth_failed("", "malformed-request", record=False)
            return
        if authzid and authzid.casefold() not in (username.casefold(),
                                                  f"{username}@{self.domain}".casefold()):
            await self._auth_failed(username, "invalid-authzid")
            return
        delay = await self._refused(username)
        if delay is None:
            return
        if delay:
            await asyncio.sleep(delay)
        # Password hashing is slow by design: off the shared database thread.
        account = await database_sync_to_async(
            auth_service.check_clear_password, thread_sensitive=False)(username, password)
        if account is None:
            await self._auth_failed(username)
            return
        await self._auth_succeeded(account, "PLAIN", None)

    async def _scram_step(self, data: bytes) -> None:
        exchange = self.scram
        assert exchange is not None
        first = exchange.username is None
        try:
            answer = await database_sync_to_async(exchange.step, thread_sensitive=False)(data)
        except ScramError:
            await self._auth_failed(exchange.username or "")
            return
        # The client-first names the account; the password is proved in the next step.
        if first and exchange.username is not None and await self._refused(
                exchange.username) is None:
            return
        if not exchange.authenticated:
            await self._write(s.sasl_challenge(answer))
            return
        account = await dbthread.run(auth_service.find_account, exchange.username or "")
        if account is None:  # removed during the exchange
            await self._auth_failed(exchange.username or "")
            return
        await self._auth_succeeded(account, "SCRAM-SHA-256", answer)

    async def _auth_succeeded(self, account: Account, method: str, final: bytes | None) -> None:
        self.scram = None
        self.authenticated = account
        self._method = method
        await dbthread.run(auth_service.record_success, self.peer_host, account.username)
        self.stream.authenticated()
        await self._write(s.sasl_success(final))

    # ------------------------------------------------------------------ stanzas

    async def _stanza(self, event: xs.Stanza) -> None:
        element = event.element
        if event.kind == "presence":
            await self._presence(element.get("type"))
            return
        if event.kind == "message":
            return  # the broker is not a chat server: messages to it are dropped
        try:
            iq = s.parse_iq(element)
        except s.IqFault as fault:
            iq_id, iq_type, to = s.iq_envelope(element)
            if iq_type not in ("result", "error"):
                await self._write(s.iq_error(iq_id, to, self.jid, fault))
            return
        if iq.command is None:
            return
        if self.session is None and not isinstance(iq.command, s.Bind | s.Session | s.Ping):
            # Before the resource is bound only binding is served (RFC 6120 §7.1).
            await self._stream_error("not-authorized", "bind a resource first")
            return
        handler = getattr(self, _handler_name(iq.command))
        sender = iq.to
        try:
            inner = await handler(iq.command, iq)
        except s.IqFault as fault:
            await self._write(s.iq_error(iq.id, sender, self.jid, fault))
        except ServiceError as exc:
            fault = _fault(exc)
            if isinstance(exc, pubsub_service.OptionsRequired):
                fault.extra = s.queue_options_required(iq.command.node, iq.command.jid)
            await self._write(s.iq_error(iq.id, sender, self.jid, fault))
        except Exception:
            logger.exception("IQ %s failed for %s", type(iq.command).__name__, self.peer)
            await self._write(s.iq_error(iq.id, sender, self.jid,
                                         s.IqFault("internal-server-error")))
        else:
            if inner is not None:
                await self._write(s.iq_result(iq.id, sender, self.jid, inner))

    async def _as_account(self, fn: Callable, *args: Any) -> Any:
        def run() -> Any:
            return fn(snapshot_for(self.account), *args)

        return await dbthread.run(run)

    def _pubsub_target(self, iq: s.Iq) -> None:
        if iq.to is not None and iq.to.casefold() != self.service_jid.casefold():
            raise s.IqFault("service-unavailable", text=f"the pubsub service is "
                            f"{self.service_jid}")

    # -- session set-up

    async def iq_bind(self, cmd: s.Bind, iq: s.Iq) -> str:
        if self.session is not None:
            raise s.IqFault("not-allowed", text="a resource is bound already")
        account = self.authenticated
        assert account is not None
        resource = cmd.resource or uuid.uuid4().hex[:12]
        if not RESOURCE_OK.match(resource):
            raise s.IqFault("bad-request", text="resource")
        session = await dbthread.run(self._begin_session, account)
        if self._ended:  # the transport ended while the session began
            await dbthread.run(auth_service.end_session, session)
            return None  # type: ignore[return-value]
        self._login_timer.cancel()
        self.account, self.account_id, self.session = account, account.pk, session
        self.jid = f"{account.username}@{self.domain}/{resource}"
        self.stream.bound()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(notify.account_group(account.pk),
                                               self.channel_name)
        self.dispatcher = get_dispatcher()
        self.dispatcher.register(self)
        await self.dispatcher.joined()
        # The result goes before the backlog: the client knows its JID first.
        await self._write(s.iq_result(iq.id, iq.to, self.jid, s.bind_result(self.jid)))
        await self._read_backlog()
        return None  # type: ignore[return-value]

    def _begin_session(self, account: Account) -> LoginSession:
        freshness.caches_were_stale()
        return auth_service.begin_session(account, peer=self.peer,
                                          method=f"xmpp:{self._method}")

    async def iq_session(self, cmd: s.Session, iq: s.Iq) -> str:
        return ""

    async def iq_ping(self, cmd: s.Ping, iq: s.Iq) -> str:
        return ""

    @property
    def _bare(self) -> str:
        return self.jid.split("/", 1)[0]

    # -- discovery

    async def iq_disco_info(self, cmd: s.DiscoInfo, iq: s.Iq) -> str:
        if iq.to is None or iq.to.casefold() in (self.domain.casefold(),
                                                 self._bare.casefold()):
            return s.disco_info(("server", "im", "SMQP broker"), s.SERVER_FEATURES, cmd.node)
        self._pubsub_target(iq)
        if cmd.node is None:
            return s.disco_info(("pubsub", "service", "SMQP topics"), s.SERVICE_FEATURES)
        node = await self._as_account(topic_service.visible_node, cmd.node)
        features = [s.PUBSUB] + ([s.QUEUEING] if pubsub_service.is_queue(node) else [])
        return s.disco_info(("pubsub", "leaf", node.path), features, cmd.node)

    async def iq_disco_items(self, cmd: s.DiscoItems, iq: s.Iq) -> str:
        if iq.to is None or iq.to.casefold() in (self.domain.casefold(),
                                                 self._bare.casefold()):
            return s.disco_items(self.service_jid, [], cmd.node) if cmd.node else \
                f"<query xmlns='{s.DISCO_ITEMS}'><item jid='{self.service_jid}'/></query>"
        self._pubsub_target(iq)
        found = await self._as_account(topic_service.children, cmd.node or "/")
        return s.disco_items(self.service_jid, [(t.path, t.path) for t in found], cmd.node)

    # -- nodes

    async def iq_create(self, cmd: s.Create, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        await self._as_account(pubsub_service.create_node, cmd.node, cmd.config)
        return f"<pubsub xmlns='{s.PUBSUB}'><create node='{escape_attr(cmd.node)}'/></pubsub>"

    async def iq_delete(self, cmd: s.Delete, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        await self._as_account(topic_service.remove_topic, cmd.node)
        return ""

    async def iq_configure_get(self, cmd: s.ConfigureGet, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        fields = await self._as_account(pubsub_service.node_config, cmd.node)
        return s.configure_result(cmd.node, fields)

    async def iq_configure_set(self, cmd: s.ConfigureSet, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        try:
            await self._as_account(pubsub_service.configure, cmd.node, cmd.config)
        except ServiceError as exc:
            if exc.code == 400:
                raise s.IqFault("not-acceptable", text=exc.text) from None
            raise
        return ""

    # -- subscriptions

    def _check_jid(self, jid: str) -> None:
        bare = jid.split("/", 1)[0]
        if bare.casefold() != self._bare.casefold():
            raise s.IqFault("bad-request", "invalid-jid", text="subscribe your own JID")

    async def iq_subscribe(self, cmd: s.Subscribe, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        self._check_jid(cmd.jid)
        requests = await self._as_account(pubsub_service.subscribe, cmd.node, cmd.options)
        # One subscription per (node, selector) (profile §9.2): the selector is in the subid.
        selector = pubsub_service.selector_of(cmd.options) or ("", "")
        subid = hashlib.sha1(f"{self.account_id}:{cmd.node.casefold()}:{selector[0].upper()}:"
                             f"{selector[1]}".encode()).hexdigest()
        options = None
        if requests is not None:
            key = cmd.node.casefold()
            self.queue_requests[key] = requests
            options = [(pubsub_service.QUEUE_REQUESTS, "text-single", [str(requests)])]
            self._unpark(key)
        await self._write(s.iq_result(iq.id, iq.to, self.jid,
                                      s.subscription_result(cmd.node, cmd.jid, subid, options)))
        await self._read_backlog()
        return None  # type: ignore[return-value]

    async def iq_unsubscribe(self, cmd: s.Unsubscribe, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        self._check_jid(cmd.jid)
        await self._as_account(topic_service.visible_node, cmd.node)
        try:
            await self._as_account(subscription_service.unsubscribe, "MESSAGE",
                                   _pattern(cmd.node))
        except ServiceError as exc:
            if exc.code == 404:
                raise s.IqFault("unexpected-request", "not-subscribed") from None
            raise
        self.queue_requests.pop(cmd.node.casefold(), None)
        return ""

    # -- items

    async def iq_publish(self, cmd: s.Publish, iq: s.Iq) -> None:
        """Handed to the dispatcher's group commit; the result goes once committed (the
        stream reads on meanwhile: results of pipelined publishes share a commit)."""
        self._pubsub_target(iq)
        if "*" in cmd.node:
            raise s.IqFault("item-not-found", text="wildcards are not node ids")
        if cmd.item_id is not None and len(cmd.item_id) > 180:
            raise s.IqFault("not-acceptable", text="item id too long")
        if cmd.item_id is not None:
            await self._as_account(pubsub_service.check_replace, cmd.node, cmd.item_id)
        request = publish.PublishRequest(
            account_id=self.account_id, guid=self.session.guid, kind="MESSAGE",
            topic=cmd.node, cmuid=pubsub_service.new_cmuid(cmd.item_id),
            message=xpayload.message_of(cmd.payload), peer=self.peer, door="xmpp")
        future = self.dispatcher.publish(request)
        self._outstanding += 1
        task = self._spawn(self._publish_result(future, cmd, iq))
        if self._outstanding >= MAX_OUTSTANDING_PUBLISHES:
            await asyncio.shield(task)
        return None

    async def _publish_result(self, future: asyncio.Future, cmd: s.Publish, iq: s.Iq) -> None:
        sender = iq.to
        try:
            published = await future
        except ServiceError as exc:
            await self._write(s.iq_error(iq.id, sender, self.jid, _fault(exc)))
            return
        except Exception:
            logger.exception("publish failed for %s", self.peer)
            await self._write(s.iq_error(iq.id, sender, self.jid,
                                         s.IqFault("internal-server-error")))
            return
        finally:
            self._outstanding -= 1
        item_id = cmd.item_id or str(published.smuid)
        if cmd.item_id is not None:
            try:
                await self._as_account(pubsub_service.replace_older, published.topic_path,
                                       cmd.item_id, published.smuid)
            except Exception:  # the new item is stored; the older one stays
                logger.exception("replacing item %s failed", cmd.item_id)
        await self._write(s.iq_result(iq.id, sender, self.jid,
                                      s.publish_result(cmd.node, item_id)))

    async def iq_items(self, cmd: s.Items, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        found = await self._as_account(pubsub_service.items, cmd.node, cmd.max_items, cmd.ids)
        if cmd.ids and not found:
            raise s.IqFault("item-not-found")
        limit = settings.SMQP_XMPP_MAX_FRAME
        return s.items_result(cmd.node, [
            (i.item_id, xpayload.payload_xml(i.message, limit, i.xmpp_item)) for i in found])

    async def iq_retract(self, cmd: s.Retract, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        key = cmd.node.casefold()
        held_here = all((key, i) in self.held_by_id for i in cmd.ids)
        # A worker's retract of what it holds (the hot path) needs no lookup of the node:
        # it was sent here from that queue node.
        node = None if held_here else await self._as_account(topic_service.visible_node,
                                                              cmd.node)
        if node is not None and not pubsub_service.is_queue(node):
            await self._as_account(pubsub_service.retract, cmd.node, cmd.ids)
            return ""
        smuids = [await self._held_item(cmd.node, i) for i in cmd.ids]
        for item_id, smuid in zip(cmd.ids, smuids, strict=True):
            await self._consume(smuid, cmd.node, item_id)
        await self._write(s.iq_result(iq.id, iq.to, self.jid))
        # XEP-0254 §2.3: the retract notification to this subscriber only.
        await self._write(s.retract_event(self.service_jid, self.jid, cmd.node, cmd.ids))
        await self._pump_here()
        return None  # type: ignore[return-value]

    async def iq_unlock(self, cmd: s.Unlock, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        node = await self._as_account(topic_service.visible_node, cmd.node)
        if not pubsub_service.is_queue(node):
            raise s.IqFault("feature-not-implemented", "unsupported", "queueing",
                            text="not a queue node")
        smuids = [await self._held_item(cmd.node, i) for i in cmd.ids]
        self._drop_held(smuids)
        await self._release(smuids)
        await self._write(s.iq_result(iq.id, iq.to, self.jid))
        await self._write(s.unlock_event(self.service_jid, self.jid, cmd.node, cmd.ids))
        await self._pump_here()
        return None  # type: ignore[return-value]

    async def _held_item(self, node: str, item_id: str) -> int:
        """The smuid of an item this session holds locked, or XEP-0254's error for it."""
        key = (node.casefold(), item_id)
        smuid = self.held_by_id.get(key)
        if smuid is not None and self.mailbox.holds(smuid):
            return smuid
        found = await dbthread.run(pubsub_service.queue_item, node, item_id)
        if found is None:
            raise s.IqFault("item-not-found")
        _, holder = found
        if holder and holder != self.session.guid:
            raise s.IqFault("conflict", text="locked by another subscriber")
        if key in self.received:
            raise s.IqFault("unexpected-request", text="no longer locked by you")
        raise s.IqFault("forbidden", text="you did not receive this item")

    async def _consume(self, smuid: int, node: str, item_id: str) -> None:
        """Retract by the holder: the ACK of the lock (consumes the item once)."""
        self._drop_held([smuid])
        payload = await self.dispatcher.load(smuid)
        receipt = payload is None or ack_service.may_want_receipt(payload[2])
        try:
            await self.dispatcher.ack_locked(
                ack_service.AckRequest(self.account_id, smuid, 1, receipt, "xmpp"),
                self.session.guid, self)
        except ServiceError as exc:
            if exc.code != 409:
                raise
            await self._release([smuid])
            raise s.IqFault("unexpected-request", text="no longer locked by you") from None

    def _drop_held(self, smuids: list[int]) -> None:
        for smuid in smuids:
            self.mailbox.unlock(smuid)
            held = self.held.pop(smuid, None)
            if held is not None:
                key = held.node.casefold()
                self.held_by_id.pop((key, held.item_id), None)
                self._unpark(key)
        self._arm_lock_timer()

    async def _release(self, smuids: list[int] | None) -> None:
        if self.session is None:
            return
        try:
            await self.dispatcher.release(self.account_id, self.session.guid, smuids)
        except Exception:  # the lock sweep ends them
            logger.exception("releasing locks failed for %s", self.peer)

    # ------------------------------------------------------------------ presence

    async def _presence(self, kind: str | None) -> None:
        if kind == "unavailable":
            # XEP-0254 §3: every outstanding item is unlocked; nothing more is sent until
            # the client is available again.
            self.available = False
            if self.held:
                self._drop_held(list(self.held))
            await self._release(None)
        elif kind in (None, "available"):
            self.available = True
            self.kick()

    # ------------------------------------------------------------------ channel layer

    async def smqp_notify(self, event: dict) -> None:
        """Account notifications from the services: an item retracted on a fan-out node."""
        if self.session is None or self.closing:
            return
        kind = event.get("kind")
        if kind == "xmpp_retract":
            await self._write(s.retract_event(self.service_jid, self.jid, event["topic"],
                                              list(event["ids"])))
        elif kind == "subscription":
            # Profile §9.3 (lease ended, right revoked, topic removed) as XEP-0060 §7.1.3's
            # subscription state notification. No item of that node is taken after: a
            # queue node's worker slots here go with it.
            pattern = event["pattern"]
            self.queue_requests.pop(pattern.casefold(), None)
            await self._write(s.subscription_event(self.service_jid, self.jid, pattern,
                                                   self._bare, event.get("reason", "")))
        elif kind == "close" and event.get("guid") == self.session.guid:
            # The operators' console closed this session (broker.services.stats): RFC 6120
            # §4.9.3.14 policy-violation, "a local service policy", is what an operator's
            # decision is; reset (§4.9.3.16) would ask the client to reconnect at once.
            # websocket_disconnect then ends the session and releases its locks.
            await self._stream_error("policy-violation", "session closed by an operator")

    async def smqp_shutdown(self, event: dict) -> None:
        await self._stream_error("system-shutdown")

    # ------------------------------------------------------------------ delivery

    @property
    def _took_locks(self) -> bool:
        return bool(self.queue_requests)

    async def _read_backlog(self) -> None:
        if self.dispatcher is None:
            return
        await self.dispatcher.caught_up()
        rows, full = await self.dispatcher.backlog([self.account_id])
        if self.mailbox.page(rows, full):
            self.kick()

    @property
    def idle(self) -> bool:
        return self.mailbox.idle and not self.closing

    def kick(self) -> None:
        busy = self._pumping or (self._pump_task is not None and not self._pump_task.done())
        if (self.mailbox.ready and self.available and not self.closing and not busy
                and self.session is not None):
            self._pump_task = asyncio.ensure_future(self._pump())
            self._pump_task.add_done_callback(self._task_done)

    async def _pump_here(self) -> None:
        """The next items go out with this answer (one write), pumped here rather than in a
        task of their own, unless the pump runs already."""
        busy = self._pumping or (self._pump_task is not None and not self._pump_task.done())
        if busy or self.session is None:
            return
        try:
            await self._pump()
        except Exception:  # the answer still goes; the dispatcher's sweep offers again
            logger.exception("next item failed for %s", self.peer)

    async def _pump(self) -> None:
        if self._pumping:
            return
        self._pumping = True
        try:
            await self._pump_next()
        finally:
            self._pumping = False

    async def _pump_next(self) -> None:
        mailbox, dispatcher = self.mailbox, self.dispatcher
        mailbox.begin_pass()
        while mailbox.inflight is None and self.available and not self.closing:
            smuid = mailbox.take_next()
            if smuid is None:
                break
            if smuid is NEED_PAGE:
                await self._read_backlog()
                continue
            try:
                if mailbox.holds(smuid):  # locked here already (offered again)
                    mailbox.done_preparing()
                    continue
                loaded = await dispatcher.load(smuid)
                if loaded is None or not await dispatcher.deliverable(
                        self.account_id, smuid, loaded[0]):
                    mailbox.done_preparing()
                    continue
                policy = await dispatcher.retry_policy(loaded[0])
                if policy.queue:
                    key = loaded[0].casefold()
                    limit = self.queue_requests.get(key, 0)
                    if not limit:
                        # This stream has not subscribed to the queue node (with its
                        # queue_requests): not its to take; it is read again from the
                        # store when the stream subscribes.
                        mailbox.done_preparing()
                        continue
                    if self._held_on(key) >= limit:
                        mailbox.done_preparing()
                        priority = _priority(loaded[2])
                        if sum(map(len, self.parked.values())) >= mailbox.page_size:
                            mailbox.offer(priority, smuid)  # too many put aside: it waits
                            break
                        self.parked[key].add((priority, smuid))
                        continue
                    if not await self._lock(smuid, policy):
                        mailbox.done_preparing()
                        continue
            except BaseException:
                mailbox.done_preparing()
                raise
            mailbox.send(smuid, loaded, locked=policy.queue)
            await self._deliver(smuid, loaded, policy)

    def _held_on(self, key: str) -> int:
        return sum(1 for h in self.held.values() if h.node.casefold() == key)

    def _unpark(self, key: str) -> None:
        parked = self.parked.pop(key, None)
        if parked:
            for priority, smuid in sorted(parked):
                self.mailbox.offer(priority, smuid)
            self.kick()

    async def _lock(self, smuid: int, policy: read.DeliveryPolicy) -> bool:
        if self.session is None:
            return False
        # Unsent until _deliver has written it; marked before the lock is asked for, since
        # the session's end may cancel this pump while the database takes the lock.
        self.unsent.add(smuid)
        if not await self.dispatcher.lock(self.account_id, self.session.guid, smuid, policy):
            self.unsent.discard(smuid)
            return False
        self.mailbox.lock(smuid, self._loop.time() + policy.retry_timeout)
        return True

    async def _deliver(self, smuid: int, loaded: tuple, policy: read.DeliveryPolicy) -> None:
        topic, cmuid, message = loaded
        mailbox = self.mailbox
        if mailbox.attempt() is None:
            return
        item_id = pubsub_service.item_id_of(cmuid, smuid)
        text = s.item_event(self.service_jid, self.jid, topic, item_id,
                            xpayload.payload_xml(message, settings.SMQP_XMPP_MAX_FRAME,
                                                 pubsub_service.is_item(cmuid)))
        if policy.queue:
            key = topic.casefold()
            self.held[smuid] = Held(topic, item_id)
            self.held_by_id[(key, item_id)] = smuid
            self.received[(key, item_id)] = None
            while len(self.received) > RECEIVED_MEMORY:
                self.received.popitem(last=False)
            if not await self._write(text):
                return  # the stream is ending: its locks go back with it, uncounted
            if self._held_frames is not None:
                self._unsent_held[len(self._held_frames) - 1] = smuid
            else:
                self.unsent.discard(smuid)
            self.dispatcher.metrics.count("deliver")
            self._count_out()
            mailbox.acked(smuid)  # the slot is free; the lock stays until retract/unlock
            self._arm_lock_timer()
            return
        held = self._held_frames is not None
        if not await self._write(text):
            return  # not sent: the stream is ending, and the message stays unACKed
        self.dispatcher.metrics.count("deliver")
        self._count_out()
        # Profile §3: delivered to the account once written to one session (a frame held
        # for the stanza's flush: once the flush wrote it).
        receipt = ack_service.may_want_receipt(message)
        request = ack_service.AckRequest(self.account_id, smuid, mailbox.attempts, receipt,
                                         "xmpp")
        if held:
            self._acks_after_flush.append(request)
        else:
            await self.dispatcher.ack(request, self)
        mailbox.acked(smuid)

    def _arm_lock_timer(self) -> None:
        if self._lock_timer is not None:
            self._lock_timer.cancel()
            self._lock_timer = None
        deadline = self.mailbox.next_lock_deadline
        if deadline is not None and not self.closing:
            self._lock_timer = self._loop.call_at(deadline, self._locks_due)

    def _locks_due(self) -> None:
        self._lock_timer = None
        self._spawn(self._expire_locks())

    async def _expire_locks(self) -> None:
        """Locks past their deadline end: the holder is told (unlock notification), and the
        items go to the next subscriber (the topic's max retries apply)."""
        async with self._turn:
            expired = [m for m in self.mailbox.expired_locks(self._loop.time())
                       if m in self.held]
            told = [(self.held[m].node, self.held[m].item_id) for m in expired]
            self._drop_held(expired)
            if expired:
                await self._release(expired)
                for node, item_id in told:
                    await self._write(s.unlock_event(self.service_jid, self.jid, node,
                                                     [item_id]))
            self._arm_lock_timer()
            self.kick()


def _priority(message: Any) -> int:
    """The (priority, smuid) order key's priority of a loaded message, as the store ranks
    it (its Priority header; none: after every prioritised one)."""
    try:
        return int(message.get("Priority") or NO_PRIORITY)
    except ValueError:
        return NO_PRIORITY


def _pattern(node: str) -> TopicPattern:
    return TopicPattern(node, False)
