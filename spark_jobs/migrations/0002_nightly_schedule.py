"""The nightly report's schedule: a django-celery-beat PeriodicTask at 00:30 UTC (yesterday's
report), editable in the admin under "Periodic tasks"."""

from django.db import migrations

NAME = "Nightly usage report"


def add(apps, schema_editor):
    crontab = apps.get_model("django_celery_beat", "CrontabSchedule")
    task = apps.get_model("django_celery_beat", "PeriodicTask")
    if task.objects.filter(name=NAME).exists():
        return
    schedule, _ = crontab.objects.get_or_create(
        minute="30", hour="0", day_of_week="*", day_of_month="*", month_of_year="*",
        timezone="UTC")
    task.objects.create(name=NAME, task="spark_jobs.nightly_usage_report", crontab=schedule,
                        description="Yesterday's usage report (PySpark); once per day.")


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("spark_jobs", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(add, remove)]
