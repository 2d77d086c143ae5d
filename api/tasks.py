"""The REST door's Celery sweep: stored Idempotency-Key results are kept
``SMQP_API_IDEMPOTENCY_HOURS`` (a retry after that publishes again)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from broker.celery import app

from .models import IdempotencyKey


def purge_idempotency_keys(now=None, limit: int = 10_000) -> int:
    """Forget the results older than the retention period (``limit`` at most per call)."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.SMQP_API_IDEMPOTENCY_HOURS)
    ids = list(IdempotencyKey.objects.filter(created__lt=cutoff).order_by("created")
               .values_list("pk", flat=True)[:limit])
    return IdempotencyKey.objects.filter(pk__in=ids).delete()[0]


@app.task(name="api.purge_idempotency_keys")
def purge_idempotency_keys_task() -> int:
    total = 0
    while (done := purge_idempotency_keys()) > 0:
        total += done
    return total
