"""The Celery application: workers run what time decides (expiry, retries, purges)."""

import os

from celery import Celery, platforms
from celery.signals import beat_init, worker_init

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


@worker_init.connect
def bound_the_pool_children_wait_at_stop(**_) -> None:
    """A pool child told to stop first waits until the worker has counted the result of its
    last task, for up to 30 s (billiard: 300 checks 0.1 s apart). A task that ends just as
    the warm shutdown begins has its result left unread, so the child waits all of it, past
    runbroker's stop deadline. Two seconds still cover a slow worker. A result left unread
    is not lost: its message, acknowledged only after the task (CELERY_TASK_ACKS_LATE),
    goes back to the queue, and each task here finds nothing left to do when run twice."""
    import billiard.pool

    billiard.pool.GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT = 20
