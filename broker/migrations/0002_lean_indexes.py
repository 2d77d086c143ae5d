"""Drop the indexes no query needs, and make two of them partial.

Every message, delivery and usage event pays for each index at INSERT (and in the WAL), on
the publish and ACK paths. Dropped: the single-column indexes that a composite or unique index
already leads with (message.topic, delivery.account, datasection.message), indexes of
columns nothing looks up by (message.state and its PostgreSQL ``_like`` twin, delivery
.next_attempt, usage event kind and account and their ``_like`` twins). The trash purge gets
a partial index on ``trashed`` (only trashed messages are in it) and replies a partial one
on ``in_reply_to``.

The field changes are state-only plus ``DROP INDEX``: Django's own AlterField would rebuild
every one of these tables on SQLite. Reversing recreates the plain indexes (not the
PostgreSQL ``_like`` ones, which only served LIKE lookups nobody makes).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

DROPPED = {
    # index name: (table, column)
    "broker_datasection_message_id_a7baf7f2": ("broker_datasection", "message_id"),
    "broker_delivery_account_id_40a2cfcf": ("broker_delivery", "account_id"),
    "broker_delivery_next_attempt_f704436b": ("broker_delivery", "next_attempt"),
    "broker_message_in_reply_to_id_25e3baaa": ("broker_message", "in_reply_to_id"),
    "broker_message_state_a107af0e": ("broker_message", "state"),
    "broker_message_topic_id_6f0f86b6": ("broker_message", "topic_id"),
    "broker_usageevent_account_829d8307": ("broker_usageevent", "account"),
    "broker_usageevent_kind_789f3ee6": ("broker_usageevent", "kind"),
}
LIKE_TWINS = ["broker_message_state_a107af0e_like", "broker_usageevent_account_829d8307_like",
              "broker_usageevent_kind_789f3ee6_like"]  # PostgreSQL only


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("topics", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in [*DROPPED, *LIKE_TWINS]],
                    reverse_sql=[f'CREATE INDEX "{name}" ON "{table}" ("{column}")'
                                 for name, (table, column) in DROPPED.items()],
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="datasection",
                    name="message",
                    field=models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE,
                        related_name="sections", to="broker.message"),
                ),
                migrations.AlterField(
                    model_name="delivery",
                    name="account",
                    field=models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries", to=settings.AUTH_USER_MODEL),
                ),
                migrations.AlterField(
                    model_name="delivery",
                    name="next_attempt",
                    field=models.DateTimeField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="in_reply_to",
                    field=models.ForeignKey(
                        blank=True, db_index=False, null=True,
                        on_delete=django.db.models.deletion.SET_NULL, related_name="replies",
                        to="broker.message"),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="state",
                    field=models.CharField(
                        choices=[("pending", "pending (in its topic's queue)"),
                                 ("trash", "trash (expired, delivered or dead; can be "
                                           "republished)"),
                                 ("deleted", "deleted")],
                        default="pending", max_length=16),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="topic",
                    field=models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE,
                        related_name="messages", to="topics.topic"),
                ),
                migrations.AlterField(
                    model_name="usageevent",
                    name="account",
                    field=models.CharField(blank=True, max_length=64),
                ),
                migrations.AlterField(
                    model_name="usageevent",
                    name="kind",
                    field=models.CharField(
                        choices=[("login", "login"), ("login_failed", "login failed"),
                                 ("logout", "logout"), ("publish", "publish"),
                                 ("deliver", "deliver"), ("ack", "ack"), ("expire", "expire"),
                                 ("dead", "dead letter"), ("republish", "republish"),
                                 ("subscribe", "subscribe"), ("unsubscribe", "unsubscribe"),
                                 ("topic", "topic change")],
                        max_length=32),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(condition=models.Q(("trashed__isnull", False)),
                               fields=["trashed"], name="message_trashed"),
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(condition=models.Q(("in_reply_to__isnull", False)),
                               fields=["in_reply_to"], name="message_in_reply_to"),
        ),
    ]
