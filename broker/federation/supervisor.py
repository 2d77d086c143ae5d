"""The link supervisor: one :class:`~.link.LinkSession` per enabled link, started, restarted
when its row changes, and stopped when it is disabled or removed. It re-reads the links
every ``SMQP_LINK_RELOAD_SECONDS``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError

from broker.models import Link
from broker.services import federation as rules
from broker.store import dbthread
from broker.store.leases import Lease

from .link import LinkConfig, LinkSession

logger = logging.getLogger("broker.federation")

T = TypeVar("T")

#: How often a link's lease is checked while a database call of the supervisor waits.
FENCE_SECONDS = 0.5


def _load() -> list[LinkConfig]:
    return [LinkConfig.of(link) for link in Link.objects.filter(enabled=True)]


def _read() -> tuple[list[LinkConfig], set[int]]:
    """The enabled links' settings and the disabled links' ids, from one query (a link
    read as neither would be taken for removed, and withdrawn)."""
    from django.utils import timezone

    rows = list(Link.objects.all())
    disabled = {link.pk for link in rows if not link.enabled}
    Link.objects.filter(pk__in=disabled).exclude(state=Link.State.DISABLED).update(
        state=Link.State.DISABLED, last_change=timezone.now())
    return [LinkConfig.of(link) for link in rows if link.enabled], disabled


def _disable(link_ids: list[int]) -> None:
    for link_id in link_ids:
        rules.record_state(link_id, Link.State.DISABLED)


def lease_name(link_id: int) -> str:
    return f"link:{link_id}"


class Supervisor:
    """In a cluster every node runs one; each link runs on the node holding its lease
    (``link:<id>``, broker/store/leases.py), renewed at every reconcile."""

    def __init__(self) -> None:
        self.sessions: dict[int, tuple[LinkSession, asyncio.Task]] = {}
        self.lease = Lease(settings.SMQP_LEASE_SECONDS)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.reconcile()
                except DatabaseError as exc:  # a database failover: try again next round
                    logger.warning("links: database unavailable (%s)", exc)
                    await self._fence()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settings.SMQP_LINK_RELOAD_SECONDS)
        finally:
            await self.stop_all()
            with contextlib.suppress(DatabaseError):
                await dbthread.run(self.lease.release)

    async def _fence(self) -> None:
        """Stop the links whose lease lapsed unrenewed (another node may run them now)."""
        lapsed = [link_id for link_id in self.sessions
                  if not self.lease.held(lease_name(link_id))]
        for link_id in lapsed:
            logger.warning("link %s: lease lapsed; stopping it here", link_id)
        # All at once: a stopped link's last database write waits behind the hung call.
        await asyncio.gather(*(self._stop(link_id) for link_id in lapsed))

    async def _fenced(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the database thread; while it waits (a database that stopped
        answering holds it until TCP gives up), the fence stops each link whose lease
        lapses meanwhile, as runbeat's does for beat."""
        call = asyncio.ensure_future(dbthread.run(fn, *args))
        while True:
            done, _ = await asyncio.wait({call}, timeout=FENCE_SECONDS)
            if done:
                return call.result()
            await self._fence()

    async def reconcile(self) -> None:
        enabled, disabled = await self._fenced(_read)
        held = await self._fenced(self.lease.renew, [lease_name(c.id) for c in enabled])
        elsewhere = {c.id for c in enabled if lease_name(c.id) not in held}
        configs = {c.id: c for c in enabled if c.id not in elsewhere}
        gone, stopped = [], False
        for link_id, (session, task) in list(self.sessions.items()):
            if link_id in elsewhere:  # another node holds its lease now: it runs there
                logger.warning("link %s: its lease is held elsewhere; stopping it here",
                               session.config.name)
                await self._stop(link_id)
                continue
            config = configs.get(link_id)
            if config is None or not config.same_settings(session.config) or task.done():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    logger.error("link %s ended: %r", session.config.name, task.exception())
                removed = config is None and link_id not in disabled
                if removed:  # removed (not merely disabled): nothing is kept there
                    await self.sessions[link_id][0].withdraw()
                await self._stop(link_id)
                stopped = True
                if config is None:
                    gone.append(link_id)
        if gone:
            await dbthread.run(_disable, gone)
        if stopped:  # what the stopped sessions left subscribed on their peers
            configs = {c.id: c for c in await dbthread.run(_load)
                       if self.lease.held(lease_name(c.id))}
        for link_id, config in configs.items():
            if link_id not in self.sessions:
                session = LinkSession(config)
                self.sessions[link_id] = (session, asyncio.create_task(session.run()))
                logger.info("link %s: started (%s:%s)", config.name, config.host, config.port)

    async def _stop(self, link_id: int) -> None:
        session, task = self.sessions.pop(link_id)
        await session.stop()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    async def stop_all(self) -> None:
        ids = list(self.sessions)
        for link_id in ids:
            await self._stop(link_id)
        if ids:
            await dbthread.run(lambda: Link.objects.filter(pk__in=ids).update(
                state=Link.State.IDLE))
