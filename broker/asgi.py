"""ASGI entry point: HTTP and WebSocket through Daphne, SMQP and QQP through ``broker.server``."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
django.setup(set_prefix=False)  # as get_asgi_application() does

import broker.celery  # noqa: E402,F401  (the admin's periodic-task form lists its tasks)
from broker.http import ThreadedASGIHandler  # noqa: E402

django_asgi_app = ThreadedASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from broker.consumers.qqp import QQPConsumer  # noqa: E402
from broker.consumers.smqp import SMQPConsumer  # noqa: E402
from broker.consumers.ws_frames import install as install_ws_frames  # noqa: E402
from broker.consumers.xmpp import XMPPConsumer  # noqa: E402

install_ws_frames()  # an oversize XMPP frame gets a stream error, not a TCP drop

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "smqp": SMQPConsumer.as_asgi(),
        "qqp": QQPConsumer.as_asgi(),
        # XMPP over WebSocket (RFC 7395), subprotocol "xmpp" (XMPP-PROFILE.md).
        "websocket": URLRouter([path("xmpp-websocket", XMPPConsumer.as_asgi())]),
    }
)
