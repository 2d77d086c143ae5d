"""The account (Django's user model) and its logged-in sessions."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.core.validators import RegexValidator
from django.db import models


class AccountNameValidator(RegexValidator):
    """Account names become topic segments (``/accounts/<name>``), so they follow its rules:
    a letter first, then letters, digits and ``_``."""

    regex = r"^[^\W\d_]\w*\Z"
    message = "An account name starts with a letter and holds only letters, digits and _."
    flags = 0


class Account(AbstractUser):
    """A login account: a person, a program, or (``is_remote_server``) another SMQP server."""

    username_validator = AccountNameValidator()

    username = models.CharField(
        "account name",
        max_length=64,
        unique=True,
        validators=[AccountNameValidator()],
        help_text="Letters, digits and _; starts with a letter. Case-insensitive.",
        error_messages={"unique": "An account with that name already exists."},
    )
    username_key = models.CharField(max_length=64, unique=True, editable=False)
    proper_name = models.CharField("proper name", max_length=200, blank=True)
    postal_address = models.TextField(blank=True)
    phone = models.CharField(max_length=64, blank=True)
    is_remote_server = models.BooleanField(
        "remote SMQP server",
        default=False,
        help_text="This account is another SMQP server that links to this one.",
    )

    class Meta:
        verbose_name = "account"
        ordering = ["username"]

    def save(self, *args, **kwargs) -> None:
        self.username_key = self.username.casefold()
        super().save(*args, **kwargs)

    @property
    def account_topic_path(self) -> str:
        return f"/accounts/{self.username}"


class LoginSession(models.Model):
    """One logged-in instance of an account; its guid tells instances of one account apart."""

    guid = models.CharField(max_length=100, unique=True, null=True, blank=True)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="sessions")
    auth_method = models.CharField(max_length=40, default="CLEAR/1.0")
    peer_address = models.CharField(max_length=100, blank=True)
    server_context = models.CharField(max_length=255, blank=True)
    started = models.DateTimeField(auto_now_add=True, db_index=True)
    ended = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-started"]
        indexes = [models.Index(fields=["account", "ended"])]

    def __str__(self) -> str:
        return self.guid or f"session {self.pk}"

    @property
    def is_live(self) -> bool:
        return self.ended is None
