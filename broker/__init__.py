"""The broker's Django project. The Celery app (``broker.celery``) is not imported here, as
Celery's Django guide suggests: only the processes that use it load it (``celery -A broker``
finds it by name, the tasks modules bind to it, the web entry point loads it for the admin's
periodic-task form). The SMQP listener, its storage processes, ``manage.py`` commands and the
``smqp`` CLI start ~0.1 s of CPU faster without it."""
