"""Celery beat stopped by SIGTERM (runbeat stopping it, the lease lost) saves its schedule
after the scheduler's interrupted database call has unwound, never inside it."""

from __future__ import annotations

import os
import signal
import time

from celery import beat
from celery.apps.beat import Beat

from broker.celery import app


class InterruptedScheduler:
    """Stands in for django-celery-beat's DatabaseScheduler: its tick is a database call that
    the SIGTERM interrupts, its close() saves the schedule."""

    max_interval = 5

    def __init__(self, *args, **kwargs) -> None:
        self.in_database_call = False
        self.saves: list[bool] = []

    def tick(self) -> float:
        self.in_database_call = True
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here, in the middle of the call
            raise AssertionError("SIGTERM did not stop beat")
        finally:
            self.in_database_call = False

    def should_sync(self) -> bool:
        return False

    def close(self) -> None:
        self.saves.append(self.in_database_call)


def test_sigterm_saves_the_schedule_once_outside_the_database_call():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    service = beat.Service(app, scheduler_cls=InterruptedScheduler, remote_control=False)
    try:
        Beat(app=app).install_sync_handler(service)  # as `celery beat` does before start
        service.start()  # sends beat_init: broker.celery's handlers take their place
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert service.scheduler.saves == [False]
