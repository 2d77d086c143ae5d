from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("spark_jobs", "0002_nightly_schedule"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagereport", name="partial",
            field=models.BooleanField(default=False)),
        migrations.AddField(
            model_name="usagereport", name="until",
            field=models.DateTimeField(blank=True, help_text="The end of what it counts.",
                                       null=True)),
        migrations.AddField(
            model_name="usagereport", name="owner",
            field=models.CharField(blank=True, max_length=200)),
        migrations.AddField(
            model_name="usagereport", name="token",
            field=models.CharField(blank=True, max_length=32)),
        migrations.AddField(
            model_name="usagereport", name="heartbeat",
            field=models.DateTimeField(blank=True, null=True)),
    ]
