"""Daphne's WebSocket protocol, with one change: a message larger than Daphne's own limit
(``--websocket_max_message_size``, 1 MiB by default) on an XMPP stream gets the stream error
``policy-violation`` and ``<close/>`` (RFC 6120 §4.9.3.14, RFC 7395 §3.6) before the
WebSocket closes (1009), as a frame over ``SMQP_XMPP_MAX_FRAME`` does in the door. Without
it autobahn drops the TCP connection below the application and the client never learns why.

The oversize payload is never buffered: autobahn stops collecting the message at the frame
header (or once the total passes the limit) and ignores the rest while closing. Installed by
:mod:`broker.asgi` (``install``) before Daphne builds its factory.
"""

from __future__ import annotations

from daphne import ws_protocol

from broker.xmpp import stanzas as s


class XmppAwareWebSocketProtocol(ws_protocol.WebSocketProtocol):
    accepted_subprotocol: str | None = None

    def serverAccept(self, subprotocol=None):
        self.accepted_subprotocol = subprotocol
        return super().serverAccept(subprotocol)

    def _max_message_size_exceeded(self, msg_size, max_msg_size, reason) -> None:
        if self.accepted_subprotocol == "xmpp" and self.state == self.STATE_OPEN:
            error = s.stream_error("policy-violation", f"frame larger than {max_msg_size} bytes")
            self.sendMessage(error.encode(), isBinary=False)
            self.sendMessage(s.close_frame().encode(), isBinary=False)
            # A closing handshake rather than a dropped socket, so that both frames arrive.
            self.failByDrop = False
        super()._max_message_size_exceeded(msg_size, max_msg_size, reason)


def install() -> None:
    ws_protocol.WebSocketFactory.protocol = XmppAwareWebSocketProtocol
