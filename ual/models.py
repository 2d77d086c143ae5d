"""User Access List entries (draft §6): who may do what on a topic and everything below it."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models

from broker.models import AppendOnlyModel


class Right(models.TextChoices):
    PUBLISH = "publish", "publish"
    SUBSCRIBE = "subscribe", "subscribe"
    MANAGE = "manage", "manage (create, rename, delete topics at or below)"
    MODIFY = "modify", "modify queue parameters"
    REPLY = "reply", "reply to messages"
    REMOTE = "remote", "access remote servers"


class PrincipalKind(models.TextChoices):
    ACCOUNT = "account", "account"
    GROUP = "group", "group of accounts"
    SERVER = "server", "remote server"
    EVERYONE = "everyone", "everyone"


class Effect(models.TextChoices):
    ALLOW = "allow", "allow"
    DENY = "deny", "deny"


class UALEntry(models.Model):
    """One right granted or denied to one principal on one topic (and, by inheritance, on
    every topic below it that has no entry of its own for that principal and right)."""

    topic = models.ForeignKey("topics.Topic", on_delete=models.CASCADE, related_name="ual_entries")
    principal_kind = models.CharField(max_length=16, choices=PrincipalKind.choices)
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="ual_entries",
        help_text="For an account or remote-server principal.",
    )
    group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.CASCADE, related_name="ual_entries"
    )
    right = models.CharField(max_length=16, choices=Right.choices)
    effect = models.CharField(max_length=8, choices=Effect.choices, default=Effect.ALLOW)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "UAL entry"
        verbose_name_plural = "UAL entries"
        ordering = ["topic__key", "principal_kind", "right"]
        constraints = [
            # One entry per principal, right and topic (partial indexes: NULLs differ in SQL).
            models.UniqueConstraint(
                fields=["topic", "principal_kind", "account", "right"],
                condition=models.Q(account__isnull=False),
                name="ual_unique_account_entry",
            ),
            models.UniqueConstraint(
                fields=["topic", "group", "right"],
                condition=models.Q(group__isnull=False),
                name="ual_unique_group_entry",
            ),
            models.UniqueConstraint(
                fields=["topic", "right"],
                condition=models.Q(principal_kind="everyone"),
                name="ual_unique_everyone_entry",
            ),
            models.CheckConstraint(
                name="ual_principal_matches_kind",
                condition=(
                    models.Q(
                        principal_kind__in=["account", "server"],
                        account__isnull=False,
                        group__isnull=True,
                    )
                    | models.Q(principal_kind="group", account__isnull=True, group__isnull=False)
                    | models.Q(principal_kind="everyone", account__isnull=True, group__isnull=True)
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect} {self.right} to {self.principal_label} on {self.topic.path}"

    @property
    def principal_label(self) -> str:
        if self.principal_kind == PrincipalKind.EVERYONE:
            return "everyone"
        if self.principal_kind == PrincipalKind.GROUP:
            return f"group {self.group}"
        return f"{self.principal_kind} {self.account}"

    def clean(self) -> None:
        kind = self.principal_kind
        if kind in (PrincipalKind.ACCOUNT, PrincipalKind.SERVER) and not self.account_id:
            raise ValidationError({"account": "Choose the account this entry is for."})
        if kind == PrincipalKind.GROUP and not self.group_id:
            raise ValidationError({"group": "Choose the group this entry is for."})
        if kind == PrincipalKind.SERVER and self.account_id and not self.account.is_remote_server:
            raise ValidationError({"account": "That account is not a remote SMQP server."})
        if kind == PrincipalKind.EVERYONE and (self.account_id or self.group_id):
            raise ValidationError("An entry for everyone names no account or group.")
        if kind != PrincipalKind.GROUP and self.group_id:
            raise ValidationError({"group": "Only group entries name a group."})
        if kind == PrincipalKind.GROUP and self.account_id:
            raise ValidationError({"account": "Group entries name no account."})


class AuditQuerySet(models.QuerySet):
    """Audit rows are written once and never changed, not even in bulk."""

    def update(self, **kwargs):
        raise PermissionError("the UAL audit log is append-only")

    def delete(self):
        raise PermissionError("the UAL audit log is append-only")

    def bulk_update(self, *args, **kwargs):
        raise PermissionError("the UAL audit log is append-only")


class UALAuditLog(AppendOnlyModel):
    """One change of one UAL entry: who made it, when, and the entry before and after.

    Written by :mod:`ual.signals` in the transaction that made the change; never changed or
    deleted afterwards (the admin shows it read-only, the model refuses)."""

    class Action(models.TextChoices):
        CREATED = "created", "created"
        CHANGED = "changed", "changed"
        DELETED = "deleted", "deleted"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(
        max_length=150,
        db_index=True,
        help_text='The admin user, "manage.py grant", or "system" (any other code path).',
    )
    append_only_refusal = "the UAL audit log is append-only"

    action = models.CharField(max_length=16, choices=Action.choices)
    entry_id = models.BigIntegerField("entry id", db_index=True)
    topic = models.CharField(max_length=1024, help_text="The topic's path at the time.")
    summary = models.CharField(max_length=2000)
    before = models.JSONField(null=True, blank=True, help_text="The entry before the change.")
    after = models.JSONField(null=True, blank=True, help_text="The entry after the change.")

    objects = AuditQuerySet.as_manager()

    class Meta:
        verbose_name = "UAL audit log entry"
        verbose_name_plural = "UAL audit log entries"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action}: {self.summary}"
