"""Queue-mode locks (profile §9.6): the holding session of a delivery, and an index for the
lock deadline sweep that holds locked rows only (fan-out deliveries are never in it)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0003_partial_expires_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="holder",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="state",
            field=models.CharField(
                choices=[("pending", "pending"),
                         ("notified", "notified, locked to a session (queue mode)"),
                         ("acked", "acknowledged"), ("dead", "dead (max retries)")],
                default="pending", max_length=16),
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(condition=models.Q(("state", "notified")),
                               fields=["next_attempt"], name="delivery_lock_deadline"),
        ),
    ]
