""":mod:`broker.asgi` for the Daphne server process: ``python -m daphne ...
broker.asgi_server:application``, as ``runbroker`` and ``deploy/`` start it.

Daphne imports its application before it runs a thread or opens a database connection, so
the storage processes of the XMPP and REST doors are forked here, as ``runsmqp`` forks its
own (:func:`broker.store.lanes.prefork`): each starts with Django loaded instead of loading
it again. A process that merely imports :mod:`broker.asgi` (a test's ASGI communicator, a
check) forks nothing."""

from broker.asgi import application
from broker.services.storage_calls import fork_storage_processes

fork_storage_processes()

__all__ = ["application"]
