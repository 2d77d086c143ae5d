"""The operators' console over HTTP: the admin's overview, topic and sessions pages, their
JSON for the live refresh, and ``/metrics``. A door: it reads ``broker.services.stats`` and
acts through the services (publish, republish, close a session)."""
