"""The ASGI applications of the TCP listeners, apart from ``broker.asgi``.

``runsmqp`` serves SMQP only and ``runqqp`` QQP only: importing ``broker.asgi`` would load
Django's HTTP handler, its middleware, the XMPP door and the other listener's consumer in
every listener process, about 0.3 s of CPU each start for code the process never runs.
Daphne keeps serving ``broker.asgi``, which routes every scope type.
"""

from __future__ import annotations

from typing import Any

from channels.routing import ProtocolTypeRouter


def smqp_application() -> Any:
    """The SMQP listener's application: ``smqp`` scopes to :class:`SMQPConsumer`."""
    from broker.consumers.smqp import SMQPConsumer

    return ProtocolTypeRouter({"smqp": SMQPConsumer.as_asgi()})


def qqp_application() -> Any:
    """The QQP listener's application: ``qqp`` scopes to :class:`QQPConsumer`."""
    from broker.consumers.qqp import QQPConsumer

    return ProtocolTypeRouter({"qqp": QQPConsumer.as_asgi()})
