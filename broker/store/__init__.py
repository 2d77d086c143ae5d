"""The store: how the services' rows reach the database.

- :mod:`.rows`: plain DB-API statements for the hot paths (no model instances).
- :mod:`.dbthread`: the listener's database threads.
- :mod:`.storage`: storage child processes that run the group commits on another core.
- :mod:`.journal`: the listener's ACK journal (ACKs durable before they are in the database).

Below it, only the models (``broker.models`` and the Django apps).
"""
