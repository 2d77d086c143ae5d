"""The index on ``message.expires`` holds only the messages whose timeout has started.

A message waits with no ``expires`` until everyone present at publish time has ACKed it, so
the plain index held an entry for every waiting message: one index insert more per publish,
and an index that a plan for "``expires IS NULL`` among these ids" could walk instead of
the primary key. The expiry sweep (``expires <= now``) implies ``expires IS NOT NULL``, so
the partial index serves it on both backends.

As in 0002: the field change is state-only plus ``DROP INDEX`` (Django's AlterField would
rebuild the table on SQLite).
"""

from django.db import migrations, models

PLAIN = "broker_message_expires_fcc04390"


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0002_lean_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{PLAIN}"',
                    reverse_sql=f'CREATE INDEX "{PLAIN}" ON "broker_message" ("expires")',
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="message",
                    name="expires",
                    field=models.DateTimeField(blank=True, null=True),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(condition=models.Q(("expires__isnull", False)),
                               fields=["expires"], name="message_expires"),
        ),
    ]
