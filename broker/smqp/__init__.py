"""Sans-IO SMQP codec: bytes in, command/reply/message objects out, and back.

No sockets, no asyncio, no Django: ``ServerConnection`` and ``ClientConnection`` are pure
state machines over bytes (in the manner of h11). Modules:

- ``errors``: ``ProtocolError``
- ``values``: topics, patterns, date-times, timeouts, keywords, booleans, smuids
- ``message``: ``Message``, ``DataSection``, header validation, serialisation
- ``commands``: one frozen dataclass per client command, parser and serialiser
- ``connection``: ``ServerConnection`` (server side of one TCP connection)
- ``replies``: replies, greeting, GET MESSAGE blocks, notifications
- ``client``: ``ClientConnection`` (client side) and its events
"""

from ._reader import CLOSED, NEED_DATA
from .client import (
    ClientConnection,
    Greeting,
    NotifyMessage,
    NotifyServer,
    NotifySub,
    NotifySubscription,
    NotifyTopic,
    ServerAck,
)
from .commands import parse_command_line, serialize_command
from .connection import ServerConnection
from .errors import ProtocolError
from .message import DataSection, Message, serialize_message, validate_publish_headers
from .replies import Reply, serialize_reply

__all__ = [
    "CLOSED",
    "NEED_DATA",
    "ClientConnection",
    "DataSection",
    "Greeting",
    "Message",
    "NotifyMessage",
    "NotifyServer",
    "NotifySub",
    "NotifySubscription",
    "NotifyTopic",
    "ProtocolError",
    "Reply",
    "ServerAck",
    "ServerConnection",
    "parse_command_line",
    "serialize_command",
    "serialize_message",
    "serialize_reply",
    "validate_publish_headers",
]
