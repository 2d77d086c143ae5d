"""The Celery application: workers run what time decides (expiry, retries, purges)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")

app = Celery("broker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
