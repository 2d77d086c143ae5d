"""The SMQP door's topic and message commands: each one service call and its reply (COUNT,
LIST, CREATE / REMOVE / SET TOPIC, FIND TOPIC, REMOVE MESSAGE, REPUBLISH, GET MESSAGE), and the
replies of pipelined publishes (PUB), written in order once committed. The door
(:class:`broker.consumers.smqp.SMQPConsumer`) mixes them in; the rules are the services'."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.services import ServiceError, publish, read
from broker.services import removal as removal_service
from broker.services import topics as topic_service
from broker.smqp import commands as c
from broker.smqp.errors import ProtocolError
from broker.smqp.replies import serialize_get_blocks
from broker.smqp.values import format_keywords, format_smuid_ranges

logger = logging.getLogger("broker.smqp")


class TopicCommands:
    """The topic and message commands of one SMQP session (a mixin of the door's
    consumer)."""

    peer: str
    _out: bytearray
    _long_reply: asyncio.Lock
    _context: str

    if TYPE_CHECKING:  # what the door provides
        def reply(self, code: int, *lines: str) -> None: ...
        async def flush(self, *, close: bool = False) -> None: ...
        async def _as_account(self, fn: Any, *args: Any) -> Any: ...

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


class PublishReplies:
    """PUB: each publish goes to the dispatcher's group commit without waiting (pipelined
    publishes share a transaction), and its reply is written once it committed, in order
    (a mixin of the door's consumer)."""

    peer: str
    account_id: int
    session: Any
    dispatcher: Any
    _outstanding: deque[tuple[asyncio.Future, str]]
    _settler: asyncio.Task | None

    if TYPE_CHECKING:  # what the door provides
        def reply(self, code: int, *lines: str) -> None: ...
        async def flush(self, *, close: bool = False) -> None: ...
        def failed(self, what: str, exc: BaseException | None = None) -> None: ...

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
