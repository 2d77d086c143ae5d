"""The store: how the services' rows reach the database, and nothing of the rules.

- :mod:`.rows`: plain DB-API statements for the hot paths (no model instances), and the hot
  transaction.
- :mod:`.messages`: the statements the hot paths run on the message tables.
- :mod:`.backends`: what differs between SQLite and PostgreSQL, behind one interface chosen
  once per process (:func:`.backends.backend`).
- :mod:`.dbthread`: the listener's database threads.
- :mod:`.lanes` (the listener's side) and :mod:`.worker` (the child's side): storage
  processes that run the group commits on another core; :mod:`.frames` between them. What
  they run is given by the services (``broker.services.storage_calls``).
- :mod:`.journal`: the listener's ACK journal (ACKs durable before they are in the database).

Below it, only the models (``broker.models`` and the Django apps) and ``broker.domain``.
"""
