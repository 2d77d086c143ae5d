"""The topic tree: real and virtual topics, keywords and queue parameters."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from . import paths

QUEUE_PARAMETERS = (
    "expiry_timeout",
    "retry_timeout",
    "max_retries",
    "max_message_count",
    "max_message_size",
    "max_queue_bytes",
)


class Topic(models.Model):
    """A topic is also its queue. A virtual topic (``link`` set) stands for a real one."""

    class State(models.TextChoices):
        ACTIVE = "active", "active"
        REMOVING = "removing", "removing (takes no publishes; deleted when its queue empties)"

    class DeliveryMode(models.TextChoices):
        FANOUT = "fanout", "fan-out (every subscriber gets every message)"
        QUEUE = "queue", "queue (each message goes to exactly one subscriber)"

    path = models.CharField(max_length=1024, help_text="As created; its case is the one shown.")
    key = models.CharField(max_length=1024, unique=True, editable=False)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    link = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="virtual_topics",
        help_text="Set for a virtual topic: the real topic it stands for.",
    )
    account = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="account_topic",
        help_text="Set for an account topic (/accounts/<name>).",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    delivery_mode = models.CharField(
        max_length=16, choices=DeliveryMode.choices, default=DeliveryMode.FANOUT
    )
    # Queue parameters; empty means "as the parent topic" (server defaults at the root).
    expiry_timeout = models.IntegerField(
        null=True, blank=True, help_text="Seconds a message is kept after delivery; -1: forever."
    )
    retry_timeout = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds before an un-ACKed notification is sent again."
    )
    max_retries = models.PositiveIntegerField(null=True, blank=True)
    max_message_count = models.PositiveIntegerField(null=True, blank=True)
    max_message_size = models.PositiveBigIntegerField(null=True, blank=True, help_text="Bytes.")
    max_queue_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="Bytes.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]
        indexes = [models.Index(fields=["parent", "key"])]

    def __str__(self) -> str:
        return f"{self.path} > {self.link.path}" if self.link_id else self.path

    @property
    def is_virtual(self) -> bool:
        return self.link_id is not None

    @property
    def depth(self) -> int:
        return len(paths.segments(self.path))

    def clean(self) -> None:
        try:
            paths.check_creatable(self.path)
        except paths.InvalidTopicPath as exc:
            raise ValidationError({"path": str(exc)}) from exc
        if self.link_id is not None:
            if self.link_id == self.pk:
                raise ValidationError({"link": "A topic cannot link to itself."})
            if self.link.link_id is not None:
                raise ValidationError({"link": "A virtual topic links only to a real topic."})
            if self.pk and self.virtual_topics.exists():
                raise ValidationError(
                    {"link": "Other virtual topics link here; it must stay a real topic."}
                )

    def save(self, *args, **kwargs) -> None:
        self.key = paths.path_key(self.path)
        super().save(*args, **kwargs)

    def ancestors(self) -> list[Topic]:
        """Parent, grandparent ... up to the first-level topic (nearest first)."""
        chain: list[Topic] = []
        node = self.parent
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain

    def resolved(self) -> Topic:
        """The real topic: itself, or the one a virtual topic links to."""
        return self.link if self.link_id else self

    def effective_parameters(self) -> dict[str, tuple[int | None, str]]:
        """Each queue parameter with where its value comes from (a topic path or "server")."""
        result: dict[str, tuple[int | None, str]] = {}
        chain = [self, *self.ancestors()]
        for name in QUEUE_PARAMETERS:
            for node in chain:
                value = getattr(node, name)
                if value is not None:
                    result[name] = (value, node.path)
                    break
            else:
                result[name] = (settings.SMQP_QUEUE_DEFAULTS.get(name), "server default")
        return result


class TopicKeyword(models.Model):
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="keywords")
    keyword = models.CharField(max_length=200)
    key = models.CharField(max_length=200, editable=False, db_index=True)
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["topic", "position"]
        constraints = [
            models.UniqueConstraint(fields=["topic", "key"], name="topic_keyword_unique")
        ]

    def __str__(self) -> str:
        return self.keyword

    def save(self, *args, **kwargs) -> None:
        self.key = self.keyword.casefold()
        super().save(*args, **kwargs)
