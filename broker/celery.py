"""The Celery application: workers run what time decides (expiry, retries, purges)."""

import os

from celery import Celery, platforms
from celery.signals import beat_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")

app = Celery("broker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@beat_init.connect
def stop_beat_between_database_calls(sender, **_) -> None:
    """celery beat's own SIGTERM/SIGINT handler saves the schedule inside the handler, that is
    in the middle of whatever database call the scheduler was making ('Cannot operate on a
    closed database' when it lands inside Django's connection close). SystemExit alone unwinds
    that call first; the beat service then saves the schedule once, on its way out."""

    def leave(signum, frame) -> None:
        raise SystemExit()

    platforms.signals.update(SIGTERM=leave, SIGINT=leave)
