"""What the listener keeps in memory for NOTIFY: committed messages (so a NOTIFY costs no
query), topics' delivery policies, and the accounts' recent "may receive" answers."""

from __future__ import annotations

import asyncio
import marshal
from collections import OrderedDict

from broker.domain.message import DataSection, Message
from broker.services import read
from broker.services.read import DeliveryPolicy
from broker.store import dbthread

# Loaded messages kept for NOTIFY (bytes of data held at most, roughly).
CACHE_BYTES = 64 * 1024 * 1024
# How long "this account may receive from this topic" is trusted without asking again. With
# the UAL cache's own poll (0.5 s) a revoked right stops notifications within a second.
GRANT_MEMO_SECONDS = 0.2
# A message not in memory is loaded with those published right after it (read-ahead): a
# session reading a backlog wants them next, at one query for the lot instead of one each.
READ_AHEAD = 64
READ_AHEAD_BYTES = 4 * 1024 * 1024


class PayloadCache:
    """Committed messages by smuid (the oldest go first past :data:`CACHE_BYTES`), delivery
    policies by topic, and subscribe rights by (account, topic), each trusted a short while."""

    def __init__(self) -> None:
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._policies: dict[str, tuple[float, DeliveryPolicy]] = {}
        self._grants: dict[tuple[int, str], float] = {}

    def remember(self, smuid: int, payload: tuple[str, str, Message]) -> None:
        entry = _pack(payload)
        self._cache[smuid] = entry
        self._cache_bytes += _entry_size(entry)
        while self._cache_bytes > CACHE_BYTES and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= _entry_size(old)

    async def load(self, smuid: int) -> tuple[str, str, Message] | None:
        """(topic path, Cmuid header, codec message) of a message, from memory or the store."""
        entry = self._cache.get(smuid)
        if entry is not None:
            return _unpack(entry)
        loaded = await dbthread.run(read.load_ahead, smuid, READ_AHEAD, READ_AHEAD_BYTES)
        for other, payload in loaded.items():
            if other != smuid:
                self.remember(other, payload)
        return loaded.get(smuid)

    async def retry_policy(self, topic_path: str) -> DeliveryPolicy:
        """(retry timeout seconds, max retries, queue mode) of a topic, cached for a few
        seconds."""
        loop = asyncio.get_running_loop()
        cached = self._policies.get(topic_path)
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        policy = await dbthread.run(read.retry_policy, topic_path)
        self._policies[topic_path] = (loop.time() + 5.0, policy)
        return policy

    async def deliverable(self, account_id: int, smuid: int, topic_path: str) -> bool:
        """May the message still go to the account (its subscribe right may have been
        revoked)? A yes is remembered per (account, topic) for :data:`GRANT_MEMO_SECONDS`, so
        a stream of notifications costs no lookup each; a no withdraws the delivery."""
        loop = asyncio.get_running_loop()
        key = (account_id, topic_path)
        if self._grants.get(key, 0.0) > loop.time():
            return True
        ok = await dbthread.run(read.deliverable, account_id, smuid)
        if ok:
            if len(self._grants) > 10_000:
                self._grants.clear()
            self._grants[key] = loop.time() + GRANT_MEMO_SECONDS
        else:
            self._grants.pop(key, None)
        return ok


# A cached message is kept as one bytes object (marshal of plain tuples, strings and bytes),
# which the garbage collector never tracks: as codec objects, a full cache of small messages
# would be half a million tracked objects, and every full collection would walk them all
# while the listener stands still; as nested tuples, many would stay tracked until a full
# collection found them.
def _pack(payload: tuple[str, str, Message]) -> bytes:
    path, cmuid, message = payload
    return marshal.dumps((path, cmuid, tuple(message.headers),
                          tuple((tuple(s.headers), s.body) for s in message.sections)))


def _unpack(entry: bytes) -> tuple[str, str, Message]:
    path, cmuid, headers, sections = marshal.loads(entry)
    return path, cmuid, Message(list(headers),
                                [DataSection(list(h), body) for h, body in sections])


def _entry_size(entry: bytes) -> int:
    """Bytes a cache entry counts for: its own, and 512 for the rest."""
    return len(entry) + 512
