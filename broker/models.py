"""Messages, their data sections, subscriptions, deliveries and the usage event log."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models


class AppendOnlyModel(models.Model):
    """A log whose rows are never changed or deleted once written: ``save`` of a stored row
    and ``delete`` raise ``PermissionError`` with the model's :attr:`append_only_refusal`."""

    append_only_refusal = "rows are append-only"

    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None and not self._state.adding:
            raise PermissionError(self.append_only_refusal)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError(self.append_only_refusal)


class Message(models.Model):
    """A published message. Its primary key is its smuid: it grows monotonically per server
    (all processes share the database) and is what clients name in GET and REPUBLISH."""

    class State(models.TextChoices):
        PENDING = "pending", "pending (in its topic's queue)"
        TRASH = "trash", "trash (expired, delivered or dead; can be republished)"
        DELETED = "deleted", "deleted"

    # Indexes match the queries: every message pays for each one at INSERT (and in WAL), so
    # none is kept that another covers (topic: the (topic, state, id) index leads with it).
    topic = models.ForeignKey("topics.Topic", on_delete=models.CASCADE, related_name="messages",
                              db_index=False)
    publisher = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    publisher_guid = models.CharField(max_length=100, blank=True)
    cmuid = models.CharField("client message id", max_length=200)
    name = models.CharField(max_length=128, blank=True)
    priority = models.PositiveIntegerField(null=True, blank=True)
    created = models.DateTimeField(help_text="When the publisher created it (its own clock).")
    received = models.DateTimeField(auto_now_add=True, db_index=True)
    timeout = models.IntegerField(
        null=True, blank=True, help_text="Seconds kept after delivery; -1: a state message."
    )
    # Indexed (partial, below) only once set: a waiting message has none until its timeout
    # starts, and pays for no index entry at publish.
    expires = models.DateTimeField(null=True, blank=True)
    depth = models.IntegerField(default=0)
    sequence = models.PositiveBigIntegerField(null=True, blank=True)
    receipt = models.BooleanField(default=False)
    reply = models.BooleanField(default=False)
    in_reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies",
        db_index=False,  # partial index below: most messages are not replies
    )
    headers = models.JSONField(
        default=list, blank=True, help_text="Other header attributes (X-*, MIME-Version) in order."
    )
    size = models.PositiveBigIntegerField(default=0, help_text="Bytes of data, all sections.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    trashed = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["topic", "state", "id"]),
            # The trash purge; only trashed messages are in it (nothing to do at publish).
            models.Index(fields=["trashed"], name="message_trashed",
                         condition=models.Q(trashed__isnull=False)),
            models.Index(fields=["in_reply_to"], name="message_in_reply_to",
                         condition=models.Q(in_reply_to__isnull=False)),
            # The expiry sweep (expires <= now); nothing reads the messages without one.
            models.Index(fields=["expires"], name="message_expires",
                         condition=models.Q(expires__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.pk} on {self.topic_id}"

    @property
    def smuid(self) -> int:
        return self.pk


class DataSection(models.Model):
    # Indexed by the unique (message, position).
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="sections",
                                db_index=False)
    position = models.PositiveSmallIntegerField()
    content_type = models.CharField(max_length=255)
    content_length = models.PositiveBigIntegerField()
    content_encoding = models.CharField(max_length=255, blank=True)
    headers = models.JSONField(default=list, blank=True, help_text="Other data header attributes.")
    body = models.BinaryField()

    class Meta:
        ordering = ["message", "position"]
        constraints = [
            models.UniqueConstraint(fields=["message", "position"], name="section_position")
        ]


class Subscription(models.Model):
    """A durable, per-account subscription: it outlives sessions, QUIT and disconnects."""

    class Resource(models.TextChoices):
        MESSAGE = "MESSAGE", "MESSAGE"
        TOPIC = "TOPIC", "TOPIC"
        SUBSCRIBERS = "SUBSCRIBERS", "SUBSCRIBERS"
        SERVER = "SERVER", "SERVER"

    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="subscriptions"
    )
    resource = models.CharField(max_length=16, choices=Resource.choices)
    pattern = models.CharField(max_length=1024, help_text="A topic, or /a/b/* for a subtree.")
    pattern_key = models.CharField(max_length=1024, editable=False)
    since = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    # Content-based subscriptions (profile §9.2): the selector's class ("JMS" or
    # "RFC-2254"; blank: every message) and text. ``selector_key`` identifies the pair in
    # the unique constraint (a hash: the text may be longer than an index entry may hold).
    selector_class = models.CharField(max_length=16, blank=True, default="")
    selector = models.TextField(blank=True, default="")
    selector_key = models.CharField(max_length=64, blank=True, default="", editable=False)
    # Leases (profile §9.3): the subscription ends then (None: at UNSUB).
    lease_end = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["account", "resource", "pattern_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["account", "resource", "pattern_key", "selector_key"],
                name="subscription_unique_selector",
            )
        ]
        indexes = [
            models.Index(fields=["resource", "pattern_key"]),
            # The lease sweep; only leased subscriptions are in it.
            models.Index(fields=["lease_end"], name="subscription_lease_end",
                         condition=models.Q(lease_end__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.account} {self.resource} {self.pattern}"

    def save(self, *args, **kwargs) -> None:
        self.pattern_key = self.pattern.casefold()
        self.selector_key = selector_key(self.selector_class, self.selector)
        super().save(*args, **kwargs)

    @property
    def is_wildcard(self) -> bool:
        return self.pattern.endswith("*")


def selector_key(selector_class: str, selector: str) -> str:
    """What identifies a subscription's selector among the account's subscriptions on one
    pattern: blank without one, else a hash of (class, text)."""
    if not selector_class:
        return ""
    return hashlib.sha256(f"{selector_class}\n{selector}".encode()).hexdigest()


class Delivery(models.Model):
    """The state of one message for one subscribing account (once-only per account).

    Queue mode (profile §9.6) keeps a message's one delivery row and moves it between
    accounts: PENDING while it waits for ``account`` (unlocked), NOTIFIED while a session of
    that account holds its lock (``holder``, until ``next_attempt``), then ACKED or DEAD.
    Fan-out deliveries go from PENDING to ACKED or DEAD and never carry a lock."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        NOTIFIED = "notified", "notified, locked to a session (queue mode)"
        ACKED = "acked", "acknowledged"
        DEAD = "dead", "dead (max retries)"

    # (account, message) is unique, and that index leads with the account.
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="deliveries",
        db_index=False,
    )
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Queue mode: locks taken (each NOTIFY under a lock counts one).
    attempts = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    # Queue mode: when the lock was last taken.
    last_attempt = models.DateTimeField(null=True, blank=True)
    # Queue mode: when the current turn ends: the lock's deadline while NOTIFIED; for a
    # waiting delivery that was moved, when it moves on again (never moved: created plus the
    # topic's retry timeout).
    next_attempt = models.DateTimeField(null=True, blank=True)
    acked = models.DateTimeField(null=True, blank=True)
    # Queue mode: the guid (LoginSession.guid) of the session holding the lock; blank when
    # unlocked. A database default: the plain-row INSERTs of the hot paths leave it out.
    holder = models.CharField(max_length=100, blank=True, default="", db_default="")

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(fields=["account", "message"], name="delivery_once")
        ]
        indexes = [
            models.Index(fields=["account", "state"]),
            # The lock deadline sweep. Only locked (queue-mode) rows are in it: a fan-out
            # delivery is never NOTIFIED, and its INSERT and ACK add no index entry here.
            models.Index(fields=["next_attempt"], name="delivery_lock_deadline",
                         condition=models.Q(state="notified")),
        ]


class UsageEvent(AppendOnlyModel):
    """Append-only log of what happened, for the nightly reports. Rows are never changed."""

    append_only_refusal = "usage events are append-only"

    class Kind(models.TextChoices):
        LOGIN = "login", "login"
        LOGIN_FAILED = "login_failed", "login failed"
        LOGOUT = "logout", "logout"
        PUBLISH = "publish", "publish"
        DELIVER = "deliver", "deliver"
        ACK = "ack", "ack"
        EXPIRE = "expire", "expire"
        DEAD = "dead", "dead letter"
        REPUBLISH = "republish", "republish"
        SUBSCRIBE = "subscribe", "subscribe"
        UNSUBSCRIBE = "unsubscribe", "unsubscribe"
        TOPIC = "topic", "topic change"

    # Two rows per delivered message (publish, ACK): only ``at`` is indexed (the reports read
    # by time; the admin filters and searches within pages ordered by it).
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    account = models.CharField(max_length=64, blank=True)
    topic = models.CharField(max_length=1024, blank=True)
    smuid = models.BigIntegerField(null=True, blank=True)
    bytes = models.BigIntegerField(default=0)
    peer = models.CharField(max_length=100, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]


class QQPResource(models.Model):
    """A ResourceID a publisher's QQP item was stored under (profile: status 1 for the same
    ResourceID again); rows older than ``SMQP_QQP_DEDUP_DAYS`` are forgotten. The row is
    claimed in the transaction of the publish batch that stores the item, and gets its smuid
    there, so that the unique constraint, not a race, decides which of two senders of one
    ResourceID publishes it (a row without an smuid was left by an earlier version of the
    door, which committed its claim before the publish)."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="+")
    resource_id = models.CharField(max_length=255)
    smuid = models.BigIntegerField(null=True, blank=True)  # None: claimed, being published
    received = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "resource_id"],
                                               name="qqp_resource_once")]


class QQPKey(models.Model):
    """An OpenPGP public key kept on an account: a QQP item whose Signature it verifies is
    published as the account. One row per key ID that may sign (the primary key's and each
    subkey's), each with the whole armored key."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="qqp_keys")
    key_id = models.CharField(max_length=16, unique=True)
    fingerprint = models.CharField(max_length=64)
    armored = models.TextField()

    def __str__(self) -> str:
        return f"{self.key_id} ({self.fingerprint})"


class Link(models.Model):
    """A federation link (profile §9.5): this server is an SMQP client of the peer, logged in
    with the account the peer gave it. It subscribes there for what subscribers here want
    below ``/<name>/`` and stores what the peer sends under that prefix. The supervisor
    (``manage.py runlinks``, started by ``runbroker``) keeps one session per enabled link and
    writes its state here."""

    class State(models.TextChoices):
        IDLE = "idle", "idle (not started)"
        CONNECTING = "connecting", "connecting"
        UP = "up", "up"
        DOWN = "down", "down (retrying with backoff)"
        DISABLED = "disabled", "disabled"

    name = models.CharField(
        max_length=64, unique=True,
        help_text="One topic segment: what the peer sends is stored under /<name>/...")
    host = models.CharField(max_length=255, help_text="The peer's address.")
    port = models.PositiveIntegerField(default=720)
    tls = models.BooleanField("SMQPS", default=False,
                              help_text="Connect over TLS (the peer's SMQPS port).")
    tls_ca = models.CharField(
        "CA file", max_length=1024, blank=True,
        help_text="PEM file of the CA that signed the peer's certificate (blank: the system's).")
    tls_server_name = models.CharField(
        max_length=255, blank=True, help_text="Name to check the peer's certificate against "
        "(blank: the host).")
    account = models.CharField(max_length=150, help_text="The account the peer gave this server.")
    # The link logs in with it, so it is kept as given (a password hash could not log in).
    password = models.CharField(max_length=255, blank=True)
    imports = models.CharField(
        max_length=1024, default="/*",
        help_text="Comma-separated topic patterns of the peer that may be imported "
                  "(/news/*, /stocks/ibm); /* is every topic.")
    peer_account = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", help_text="The account the peer logs in with here (its backlog: "
        "what this server holds for the peer).")
    enabled = models.BooleanField(default=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IDLE,
                             editable=False)
    last_error = models.TextField(blank=True, editable=False)
    last_change = models.DateTimeField(null=True, blank=True, editable=False)
    last_connected = models.DateTimeField(null=True, blank=True, editable=False)
    stored = models.PositiveBigIntegerField(default=0, editable=False,
                                            help_text="Messages received and stored here.")
    dropped = models.PositiveBigIntegerField(
        default=0, editable=False, help_text="Messages received and dropped (a loop, a "
        "duplicate, Depth spent, or outside the imports).")
    subscribed = models.TextField(blank=True, editable=False,
                                  help_text="What the link subscribes to on the peer now.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.account}@{self.host}:{self.port})"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from broker.domain.errors import ProtocolError
        from broker.domain.values import is_reserved_segment, validate_topic

        try:
            if "/" in self.name:
                raise ProtocolError(400, "a slash")
            validate_topic("/" + self.name)
        except ProtocolError:
            raise ValidationError({"name": "One topic segment: a letter, then letters, "
                                           "digits or _."}) from None
        if is_reserved_segment(self.name) or self.name.casefold() == "accounts":
            raise ValidationError({"name": "Trash and accounts are reserved."})


class FederatedOrigin(models.Model):
    """An origin (``X-Origin``: ``<context>/<smuid>``) already stored here, and the message it
    became: a second copy, by another route or sent again after a broken link, is dropped."""

    origin = models.CharField(max_length=300, unique=True)
    message = models.ForeignKey(Message, null=True, on_delete=models.SET_NULL, related_name="+",
                                db_index=False)
    link = models.CharField(max_length=64)
    received = models.DateTimeField(auto_now_add=True, db_index=True)


class ClusterLease(models.Model):
    """Who runs a job that must run on one node of a cluster at a time (Celery beat, each
    federation link): held until ``expires_at`` (the database's clock) unless renewed, then
    free for any node to take (broker/store/leases.py)."""

    name = models.CharField(max_length=200, primary_key=True)
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "broker_cluster_lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or 'nobody'} until {self.expires_at}"
