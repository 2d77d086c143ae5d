"""The XMPP door's pubsub service commands (XEP-0060, XMPP-PROFILE §4-§6): discovery, node
creation, deletion and configuration, subscriptions, publishing (its result written once
committed) and item reads, each a service call and its IQ result. The door
(:class:`broker.consumers.xmpp.XMPPConsumer`) mixes them in; the queue items a session holds
(retract, unlock) are the door's own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from django.conf import settings

from broker.delivery.session import SubscriberSession
from broker.domain.values import TopicPattern
from broker.services import ServiceError, publish
from broker.services import pubsub as pubsub_service
from broker.services import subscriptions as subscription_service
from broker.services import topics as topic_service
from broker.xmpp import payload as xpayload
from broker.xmpp import stanzas as s
from broker.xmpp.xml import escape_attr

# Publishes of one session waiting for their commit before it stops reading.
MAX_OUTSTANDING_PUBLISHES = 1024


class PubsubCommands:
    """The pubsub service commands of one XMPP stream (a mixin of the door's consumer)."""

    jid: str
    peer: str
    domain: str
    service_jid: str
    account_id: int
    session: Any
    dispatcher: Any
    queue_requests: dict[str, int]
    delivery: SubscriberSession
    _outstanding: int  # publishes handed to the dispatcher, their result not written yet

    if TYPE_CHECKING:  # what the door provides
        @property
        def _bare(self) -> str: ...
        def _pubsub_target(self, iq: s.Iq) -> None: ...
        async def _as_account(self, fn: Any, *args: Any) -> Any: ...
        async def _write(self, text: str) -> bool: ...
        def spawn(self, coro: Coroutine, what: str) -> asyncio.Task: ...
        def failed(self, what: str, exc: BaseException | None = None) -> None: ...

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
        subid = s.subscription_id(self.account_id, cmd.node,
                                  pubsub_service.selector_of(cmd.options))
        options = None
        if requests is not None:
            key = cmd.node.casefold()
            self.queue_requests[key] = requests
            options = [(pubsub_service.QUEUE_REQUESTS, "text-single", [str(requests)])]
            self.delivery.unpark(key)
        await self._write(s.iq_result(iq.id, iq.to, self.jid,
                                      s.subscription_result(cmd.node, cmd.jid, subid, options)))
        await self.delivery.read_backlog()
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
        task = self.spawn(self._publish_result(future, cmd, iq), "publish result")
        if self._outstanding >= MAX_OUTSTANDING_PUBLISHES:
            await asyncio.shield(task)
        return None

    async def _publish_result(self, future: asyncio.Future, cmd: s.Publish, iq: s.Iq) -> None:
        sender = iq.to
        try:
            published = await future
        except ServiceError as exc:
            await self._write(s.iq_error(iq.id, sender, self.jid, s.fault_of(exc)))
            return
        except Exception:
            self.failed("publish")
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
                self.failed(f"replacing item {cmd.item_id}")
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


def _pattern(node: str) -> TopicPattern:
    return TopicPattern(node, False)
