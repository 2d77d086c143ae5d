"""Leases in the database: exactly one node of a cluster runs Celery beat, and one runs each
federation link, and another takes over when the holder dies.

A lease is a row (:class:`broker.models.ClusterLease`) naming its holder and when it expires,
by the database's clock, so that nodes' clocks do not matter. Taking and renewing are one
conditional UPDATE (``holder = me OR expires_at < now()``): on PostgreSQL a concurrent
taker's UPDATE waits for the row lock and then sees the new holder, so two nodes never both
succeed.

The holder fences itself: :class:`Lease` counts the lease as held only until the moment it
asked for it plus the lease time, less a margin (local monotonic clock), so it stops its
work before the database would let anyone else start, even when it cannot reach the
database to hear that it lost. A taker may start ``ttl`` after the holder's last renewal.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import uuid

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now

from broker.models import ClusterLease

logger = logging.getLogger("broker.leases")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def holder_name() -> str:
    """This process's name as a holder: node (SMQP_NODE_NAME or host name), pid, and a
    random part (a pid is reused after a restart)."""
    node = os.environ.get("SMQP_NODE_NAME") or socket.gethostname()
    return f"{node}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def acquire(names: list[str], holder: str, ttl: float) -> set[str]:
    """Take or renew the leases ``names`` for ``ttl`` seconds: those now held by ``holder``."""
    if not names:
        return set()
    expires = ExpressionWrapper(Now() + datetime.timedelta(seconds=ttl),
                                output_field=DateTimeField())
    held: set[str] = set()
    for name in names:
        with transaction.atomic():
            if not ClusterLease.objects.filter(name=name).exists():
                try:
                    with transaction.atomic():
                        ClusterLease.objects.create(name=name, holder="", expires_at=_EPOCH)
                except IntegrityError:
                    pass  # another node made it first: the UPDATE below decides
            taken = ClusterLease.objects.filter(name=name).filter(
                Q(holder=holder) | Q(expires_at__lt=Now())).update(
                expires_at=expires,
                acquired_at=Case(When(holder=holder, then=F("acquired_at")), default=Now(),
                                 output_field=DateTimeField()),
                holder=Value(holder))
        if taken:
            held.add(name)
    return held


def release(names: list[str], holder: str) -> None:
    """Give the leases back at once (a clean stop): the next node need not wait them out."""
    if names:
        ClusterLease.objects.filter(name__in=names, holder=holder).update(expires_at=_EPOCH)


def holders(prefix: str = "") -> dict[str, str]:
    """Each live lease's holder (for the console and the tests)."""
    return dict(ClusterLease.objects.filter(name__startswith=prefix, expires_at__gte=Now())
                .values_list("name", "holder"))


class Lease:
    """One process's hold on a set of leases, renewed by calling :meth:`renew` more often
    than ``ttl`` (every ``ttl / 3`` is the usual pace)."""

    def __init__(self, ttl: float, holder: str | None = None) -> None:
        self.ttl = ttl
        self.holder = holder or holder_name()
        self.margin = min(2.0, ttl / 5)
        self._until: dict[str, float] = {}

    def renew(self, names: list[str]) -> set[str]:
        """Take or renew ``names``; those held now (a database error keeps what is still
        within its time)."""
        asked = time.monotonic()
        try:
            got = acquire(names, self.holder, self.ttl)
        except DatabaseError as exc:
            logger.warning("lease renewal failed (%s); held ones lapse in time", exc)
            connection.close_if_unusable_or_obsolete()
            return {name for name in names if self.held(name)}
        for name in names:
            if name in got:
                self._until[name] = asked + self.ttl - self.margin
            else:  # the database says another holder has it
                self._until.pop(name, None)
        # A renewal that waited (on a row lock, a slow database) past its own fence is no
        # hold: the row's time ran from its transaction's start, so it may have lapsed
        # already and another node may be taking it. The next renewal decides.
        held = {name for name in got if self.held(name)}
        if held != got:
            logger.warning("lease renewal took %.1f s, past its fence: not holding %s",
                           time.monotonic() - asked, sorted(got - held))
        return held

    def held(self, name: str) -> bool:
        return time.monotonic() < self._until.get(name, 0.0)

    def release(self, names: list[str] | None = None) -> None:
        names = list(self._until) if names is None else names
        for name in names:
            self._until.pop(name, None)
        try:
            release(names, self.holder)
        except DatabaseError as exc:
            logger.warning("lease release failed (%s); it lapses in %s s", exc, self.ttl)
