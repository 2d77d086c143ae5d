"""Bearer tokens of the REST API and the stored results of Idempotency-Key requests."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """One bearer token of an account: several per account, each named, expiring and
    revocable. Only a SHA-256 digest of its secret is stored (the secret is 256 random
    bits, so a fast hash is enough: nothing to guess from the digest); ``key_id`` is the
    public part that finds the row. The whole token is shown once, when it is made."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for.")
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    revoked = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API token"
        ordering = ["account", "-created"]
        indexes = [models.Index(fields=["account", "created"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_id})"

    @property
    def active(self) -> bool:
        return self.revoked is None and self.expires > timezone.now()


class IdempotencyKey(models.Model):
    """The first result of a publish sent with an ``Idempotency-Key``: a retry with the same
    key (same account) gets it back instead of publishing again. Stored in the publish's
    own transaction, so a result is here exactly when its message is."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request.")
    status = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "key"],
                                               name="api_idempotency_once")]
