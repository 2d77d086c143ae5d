"""The XMPP door (XMPP-PROFILE.md): one Channels consumer per WebSocket connection at
``/xmpp-websocket`` (subprotocol ``xmpp``), served by Daphne.

Each text frame goes to the sans-IO stream (:mod:`broker.xmpp.stream`); each IQ is parsed
into a command (:mod:`broker.xmpp.stanzas`) and handled by an ``iq_<command>`` method
(aiosmtpd-style, as the SMQP door). Every rule is a service's: publish, subscribe, locks, ACK
and reads go through the same :mod:`broker.services` and dispatcher as SMQP's, so an item
published at either door reaches subscribers at both, and queue workers at both compete for
the same items.

Delivery: a :class:`~broker.delivery.session.SubscriberSession` like an SMQP session's, this
door writing what it sends (``write_message``) and giving its credit per queue node. On a
fan-out node a message counts as delivered once written (it is ACKed at once). On a queue
node each item is locked to this session before it goes (SMQP-PROFILE §9.6) and stays
locked until the client retracts (consumes) or unlocks it, its lock times out, the client
sends unavailable presence, or the stream ends; up to ``pubsub#queue_requests`` locks per
node at a time (the in-flight slot of the mailbox is freed as soon as the item is written;
the lock stays in the mailbox's lock table).

The SASL exchange (:mod:`.xmpp_login`) and the pubsub service commands (:mod:`.xmpp_pubsub`)
are modules of their own; their wire forms are the codec's (:mod:`broker.xmpp`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections import OrderedDict
from typing import Any

from channels.exceptions import StopConsumer
from django.conf import settings

from accounts.models import Account, LoginSession
from broker.consumers.base import DoorConsumer
from broker.consumers.xmpp_login import SaslLogin
from broker.consumers.xmpp_pubsub import PubsubCommands
from broker.delivery import get_dispatcher
from broker.delivery.session import Held, Payload, SubscriberSession
from broker.services import ServiceError, freshness, notify
from broker.services import auth as auth_service
from broker.services import pubsub as pubsub_service
from broker.services import topics as topic_service
from broker.services.login import AuthChecks, LoginFlow
from broker.store import dbthread
from broker.xmpp import payload as xpayload
from broker.xmpp import stanzas as s
from broker.xmpp import stream as xs

logger = logging.getLogger("broker.xmpp")

SUBPROTOCOL = "xmpp"
# Items a session remembers having received (for XEP-0254's unexpected-request vs
# forbidden): the most recent ones.
RECEIVED_MEMORY = 10_000
# After the server's <close/>, how long the client has to close the WebSocket itself.
CLOSE_GRACE_SECONDS = 5.0
RESOURCE_OK = re.compile(r"^[^\s/@<>&'\"]{1,64}$")


def _handler_name(command: Any) -> str:
    return "iq_" + re.sub(r"(?<!^)(?=[A-Z])", "_", type(command).__name__).lower()


class XMPPConsumer(SaslLogin, PubsubCommands, DoorConsumer):
    """One XMPP stream over one WebSocket. Its delivery (mailbox, pump, queue-node locks)
    is a :class:`~broker.delivery.session.SubscriberSession`; this class writes item
    events and reads retracts, unlocks and presence."""

    logger = logger
    # Profile §3: a fan-out item is delivered once written; a queue item stays locked
    # until retracted or unlocked (XEP-0254).
    acks_on_write = True

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
        self.authenticated: Account | None = None
        self.account: Account | None = None
        self.jid = ""
        self.login = LoginFlow(AuthChecks(self.peer_host), methods=mechanisms,
                               clear_allowed="PLAIN" in mechanisms)
        self.available = True
        self._outstanding = 0
        self.delivery = SubscriberSession(self, settings.SMQP_BACKLOG_PAGE, door_name="xmpp",
                                          turn=getattr(self, "_turn", None))
        # Queue nodes: queue_requests per node key (the session's credit there), and the
        # items received lately.
        self.queue_requests: dict[str, int] = {}
        self.received: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._loop = asyncio.get_running_loop()
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
            self.failed("XMPP frame")
            await self._stream_error("internal-server-error")

    async def websocket_disconnect(self, event: dict) -> None:
        self._disconnected = True
        await self.end_session()
        raise StopConsumer()

    def stop_door(self) -> None:
        self._login_timer.cancel()

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
        written = True
        for text in held or ():
            if not await self._send_frame(text):
                written = False
                break
        await self.delivery.flush_acks(written)

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
            self.spawn(self._close_transport(), "closing the WebSocket")

    async def _close_transport(self) -> None:
        try:
            await self.send({"type": "websocket.close", "code": 1000})
        except Exception:  # closed by the peer meanwhile
            self._disconnected = True

    def _login_timed_out(self) -> None:
        if self.session is None and not self.closing:
            self.spawn(self._stream_error("connection-timeout", "no login in time"),
                       "login timeout")

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
            self.delivery.defer_acks()
            try:
                await self._stanza(event)
            finally:
                await self._flush()

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
            fault = s.fault_of(exc)
            if isinstance(exc, pubsub_service.OptionsRequired):
                fault.extra = s.queue_options_required(iq.command.node, iq.command.jid)
            await self._write(s.iq_error(iq.id, sender, self.jid, fault))
        except Exception:
            self.failed(f"IQ {type(iq.command).__name__}")
            await self._write(s.iq_error(iq.id, sender, self.jid,
                                         s.IqFault("internal-server-error")))
        else:
            if inner is not None:
                await self._write(s.iq_result(iq.id, sender, self.jid, inner))

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
        # Nothing is delivered before the ACKs of what is written can commit (the storage
        # processes of this web process start with its first stream).
        await get_dispatcher().storage_ready()
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
        self.delivery.register(get_dispatcher())
        await self.dispatcher.joined()
        # The result goes before the backlog: the client knows its JID first.
        await self._write(s.iq_result(iq.id, iq.to, self.jid, s.bind_result(self.jid)))
        await self.delivery.read_backlog()
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

    # -- items

    async def iq_retract(self, cmd: s.Retract, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        key = cmd.node.casefold()
        held_here = all((key, i) in self.delivery.held_by_id for i in cmd.ids)
        # A worker's retract of what it holds (the hot path) needs no lookup of the node:
        # it was sent here from that queue node.
        node = None if held_here else await self._as_account(topic_service.visible_node,
                                                              cmd.node)
        if node is not None and not pubsub_service.is_queue(node):
            await self._as_account(pubsub_service.retract, cmd.node, cmd.ids)
            return ""
        smuids = [await self._held_item(cmd.node, i) for i in cmd.ids]
        for smuid in smuids:
            try:
                await self.delivery.consume(smuid)
            except ServiceError as exc:
                if exc.code != 409:
                    raise
                raise s.IqFault("unexpected-request", text="no longer locked by you") from None
        await self._write(s.iq_result(iq.id, iq.to, self.jid))
        # XEP-0254 §2.3: the retract notification to this subscriber only.
        await self._write(s.retract_event(self.service_jid, self.jid, cmd.node, cmd.ids))
        await self.delivery.pump_here()
        return None  # type: ignore[return-value]

    async def iq_unlock(self, cmd: s.Unlock, iq: s.Iq) -> str:
        self._pubsub_target(iq)
        node = await self._as_account(topic_service.visible_node, cmd.node)
        if not pubsub_service.is_queue(node):
            raise s.IqFault("feature-not-implemented", "unsupported", "queueing",
                            text="not a queue node")
        smuids = [await self._held_item(cmd.node, i) for i in cmd.ids]
        self.delivery.drop_held(smuids)
        await self.delivery.release(smuids)
        await self._write(s.iq_result(iq.id, iq.to, self.jid))
        await self._write(s.unlock_event(self.service_jid, self.jid, cmd.node, cmd.ids))
        await self.delivery.pump_here()
        return None  # type: ignore[return-value]

    async def _held_item(self, node: str, item_id: str) -> int:
        """The smuid of an item this session holds locked, or XEP-0254's error for it."""
        key = (node.casefold(), item_id)
        smuid = self.delivery.held_by_id.get(key)
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

    # ------------------------------------------------------------------ presence

    async def _presence(self, kind: str | None) -> None:
        if kind == "unavailable":
            # XEP-0254 §3: every outstanding item is unlocked; nothing more is sent until
            # the client is available again.
            self.available = False
            await self.delivery.release_all()
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

    def may_send(self) -> bool:
        return self.available

    def queue_credit(self, topic: str) -> int:
        return self.queue_requests.get(topic.casefold(), 0)

    async def write_message(self, smuid: int, payload: Payload) -> bool:
        topic, cmuid, message = payload
        item_id = pubsub_service.item_id_of(cmuid, smuid)
        if smuid in self.delivery.held:  # a queue item: remembered (see _held_item)
            self.received[(topic.casefold(), item_id)] = None
            while len(self.received) > RECEIVED_MEMORY:
                self.received.popitem(last=False)
        return await self._write(s.item_event(
            self.service_jid, self.jid, topic, item_id,
            xpayload.payload_xml(message, settings.SMQP_XMPP_MAX_FRAME,
                                 pubsub_service.is_item(cmuid))))

    async def locks_expired(self, held: list[Held]) -> None:
        """XEP-0254: the holder is told its expired locks ended (unlock notification)."""
        for item in held:
            await self._write(s.unlock_event(self.service_jid, self.jid, item.node,
                                             [item.item_id]))
