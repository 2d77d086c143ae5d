"""The QQP door (profile: QQP ingestion): one connection of ``runqqp``'s listener.

It greets, reads netstring-framed SXDF items (``broker.qqp``), and publishes each through the
dispatcher's group commit as the SMQP door does, answering a status string once the commit
is done. Items are taken one at a time: the sender waits for each status (QQP section 2).
The ResourceID is claimed in the publish batch's transaction (:mod:`broker.services.publish`),
so the door keeps no record of ResourceIDs of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError

from broker.delivery import get_dispatcher
from broker.domain import message as codec
from broker.qqp import protocol
from broker.qqp.errors import OverLimit, QQPError
from broker.qqp.netstring import NetstringReader
from broker.services import ServiceError, publish, qqp_resources, qqp_signatures
from broker.store import dbthread

logger = logging.getLogger("broker.qqp")

CONTENT_TYPE = "application/x-sxdf"
#: The smallest item there is (``0:,``): with less of the SessionLimit left, none fits.
SMALLEST_ITEM = 3

class _Refused(Exception):
    """A status other than 2 for this item: (code, text)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text


def _refused(exc: ServiceError) -> _Refused:
    """The QQP status for a refusal of the services: its Refusal's digit, 4 (not stored, the
    server's fault: try again later) or 5 (refused, with the SMQP code and text)."""
    if exc.refusal.qqp == 4:
        return _Refused(4, f"not stored ({exc.text}); try again later")
    return _Refused(5, f"refused: {exc.code} {exc.text}")


def _resource_id_ok(resource_id: str) -> bool:
    # It becomes a header value (X-Resource-Id) and the Cmuid: printable, one line.
    return 0 < len(resource_id) <= 200 and resource_id.isprintable()


class QQPConsumer:
    """One QQP connection: the ASGI application ``broker.asgi`` routes ``qqp`` scopes to."""

    def __init__(self, scope: dict, receive: Callable, send: Callable) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        client = scope.get("client") or ["", 0]
        self.address = str(client[0])
        self.peer = f"{client[0]}:{client[1]}"
        self.item_limit = settings.SMQP_QQP_ITEM_LIMIT
        self.session_limit = settings.SMQP_QQP_SESSION_LIMIT
        self.reader = NetstringReader(self.item_limit, self.session_limit)
        self.closing = False  # the listener shuts down: the next status is a 3
        self._unsigned_account: int | None = None

    @classmethod
    def as_asgi(cls) -> Callable:
        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            await cls(scope, receive, send).run()
        return app

    async def run(self) -> None:
        greeting = protocol.Greeting(item_limit=self.item_limit, session_limit=self.session_limit,
                                     exceptions_to=settings.SMQP_QQP_EXCEPTIONS_TO)
        await self.send({"type": "qqp.send", "bytes": greeting.encode()})
        while True:
            event = await self.receive()
            kind = event["type"]
            if kind == "qqp.receive":
                if not await self._received(event["bytes"]):
                    return
            elif kind == "qqp.shutdown":
                self.closing = True
                if not self.reader.pending:
                    await self.send({"type": "qqp.close"})
                    return
            elif kind == "qqp.disconnect":
                return

    async def _received(self, data: bytes) -> bool:
        """Answer the items ``data`` completes; False once the connection is closed."""
        try:
            bodies = self.reader.feed(data)
        except QQPError as exc:
            return await self._refuse_stream(exc)
        for body in bodies:
            try:
                await self._store(body)
            except _Refused as refused:
                if not await self._status(refused.code, refused.text):
                    return False
                continue
            left = self.session_limit - self.reader.received
            if self.closing or left < SMALLEST_ITEM:
                return await self._status(3, "stored; closing")
            if not await self._status(2, "stored"):
                return False
        if self.reader.error is not None:  # whole items came before the fault: answered
            return await self._refuse_stream(self.reader.error)
        return True

    async def _refuse_stream(self, exc: QQPError) -> bool:
        if isinstance(exc, OverLimit):
            which = "SessionLimit" if exc.session else "ItemLimit"
            return await self._status(5, f"over the {which}", detail=2)
        return await self._status(5, f"not a netstring ({exc})", detail=1)

    async def _status(self, code: int, text: str, detail: int = 0) -> bool:
        """Send a status; a 3 or more closes the connection (False)."""
        close = code >= 3
        await self.send({"type": "qqp.send", "bytes": protocol.status(code, text, detail),
                         "close": close})
        return not close

    async def _store(self, body: bytes) -> None:
        """Publish one item; raises _Refused for any status but 2."""
        try:
            item = protocol.parse_item(body)
        except QQPError as exc:
            raise _Refused(5, f"not an SXDF data item ({exc})") from None
        if not item.action.startswith("smqp:"):
            raise _Refused(5, "the Action is not an smqp: URL")
        if not _resource_id_ok(item.resource_id):
            raise _Refused(5, "the ResourceID is not one printable line of 200 characters")
        account_id = await self._publisher(item)
        await self._publish_once(account_id, item)

    async def _publisher(self, item: protocol.Item) -> int:
        if item.signature is not None:
            try:
                return await dbthread.run(qqp_signatures.signer, item.canonical_data,
                                          item.signature)
            except qqp_signatures.BadSignature as exc:
                raise _Refused(5, exc.text) from None
            except DatabaseError:
                logger.warning("QQP: the store is unavailable for %s", self.peer, exc_info=True)
                raise _Refused(4, "the store is unavailable; try again later") from None
        refusal = qqp_resources.unsigned_refusal(self.address)
        if refusal:
            raise _Refused(5, refusal)
        if self._unsigned_account is None:
            try:
                self._unsigned_account = await dbthread.run(qqp_resources.unsigned_account_id)
            except DatabaseError:
                logger.warning("QQP: the store is unavailable for %s", self.peer, exc_info=True)
                raise _Refused(4, "the store is unavailable; try again later") from None
            if self._unsigned_account is None:
                raise _Refused(5, "unsigned items are not accepted (SMQP_QQP_UNSIGNED_ACCOUNT "
                                  "names no active account)")
        return self._unsigned_account

    async def _publish_once(self, account_id: int, item: protocol.Item) -> int:
        """Publish the item, its ResourceID claimed in the same transaction (a replay of a
        stored one, even in the same batch, stores nothing: status 1); its smuid once
        committed."""
        rid = item.resource_id
        message = codec.Message(
            headers=[("X-Resource-Id", rid)],
            sections=[codec.DataSection([("Content-Type", CONTENT_TYPE)],
                                        item.canonical_data)])
        request = publish.PublishRequest(
            account_id=account_id, guid="", kind="MESSAGE", topic=item.action[len("smqp:"):],
            cmuid=rid, message=message, peer=self.peer, door="qqp", resource_id=rid)
        try:
            published = await get_dispatcher().publish(request)
        except ServiceError as exc:
            raise _refused(exc) from None
        except Exception:
            logger.exception("QQP publish failed for %s", self.peer)
            raise _Refused(4, "not stored (server error); try again later") from None
        if isinstance(published, qqp_resources.Redundant):
            raise _Refused(1, f"redundant: stored before as {published.smuid}")
        return published.smuid
