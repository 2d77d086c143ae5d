"""The usage event log: one row per thing that happened, for the nightly reports."""

from __future__ import annotations

from typing import Any

from broker.models import UsageEvent


def record(
    kind: str,
    *,
    account: str = "",
    topic: str = "",
    smuid: int | None = None,
    size: int = 0,
    peer: str = "",
    **detail: Any,
) -> None:
    UsageEvent.objects.create(
        kind=kind, account=account, topic=topic, smuid=smuid, bytes=size, peer=peer, detail=detail
    )
