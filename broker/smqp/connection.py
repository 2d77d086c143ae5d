"""The server side of one SMQP connection, sans-IO (in the manner of h11).

Feed received bytes with ``receive_data`` and pull events with ``next_event`` until it
returns ``NEED_DATA``::

    conn = ServerConnection()
    conn.receive_data(data)
    while (event := conn.next_event()) is not NEED_DATA:
        if event is CLOSED: ...              # peer closed; nothing partial is emitted
        elif isinstance(event, ProtocolError): reply(event.code, event.text)
        else: dispatch(event)                # a command object

Malformed input never raises: it is returned as a ``ProtocolError`` event and the
connection stays usable (an over-long line is discarded up to its LF; a bad PUB message is
skipped up to its terminating ``.`` line, data of known length being skipped by length).
"""

from __future__ import annotations

from ._reader import (
    CLOSED,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_LINE,
    DEFAULT_MAX_MESSAGE,
    NEED_DATA,
    TOO_LONG,
    Reader,
    Sentinel,
    decode_line,
)
from .commands import (
    Command,
    Publish,
    PublishStart,
    RawLine,
    is_publish_line,
    parse_command_line,
)
from .errors import ProtocolError
from .message import Message

__all__ = ["CLOSED", "NEED_DATA", "ServerConnection", "ServerEvent"]

ServerEvent = Command | ProtocolError | Sentinel

_LINE_TOO_LONG = "Bad request (line too long)"


class ServerConnection(Reader):
    """Parser of what a client sends: command lines and PUB messages.

    ``max_line``: longest command or header line, line ending excluded (longer ones give
    ``400 Bad request (line too long)``). ``max_message``: largest total of declared
    Content-Lengths in one message (more gives ``414 Resource too large`` after the
    message's ``.``; the data are discarded as they arrive). ``max_header_bytes``: largest
    total of header and data-header lines of one message (also 414).
    """

    def __init__(
        self,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    ) -> None:
        super().__init__(max_line, max_message, max_header_bytes)
        self._raw = False
        self._pub: PublishStart | None = None
        self._validate = True

    def expect_raw_line(self) -> None:
        """Return the next non-empty complete line as ``RawLine(text)`` instead of parsing
        it as a command (authentication continuation lines)."""
        self._raw = True

    def next_event(self) -> ServerEvent:
        """Return the next command, a ``ProtocolError`` for bad input, ``NEED_DATA`` or
        ``CLOSED``. Never raises."""
        while True:
            if self._mstate:
                if not self._advance_message():
                    return self._need()
                return self._finish_publish()
            line = self._read_line()
            if line is None:
                return self._need()
            if line is TOO_LONG:
                error = ProtocolError(400, _LINE_TOO_LONG)
                if not self._raw and is_publish_line(self._long_head):
                    # Its message follows: skip it rather than read it as commands.
                    self._pub = None
                    self._begin_message(error)
                    continue
                self._raw = False
                return error
            if not line or line.isspace():
                continue
            if self._raw:
                self._raw = False
                try:
                    return RawLine(decode_line(line))
                except ProtocolError as e:
                    return e
            try:
                cmd = parse_command_line(decode_line(line))
            except ProtocolError as e:
                if is_publish_line(line):
                    # A PUB line is followed by its message whatever is wrong with it:
                    # skip the message and answer once, after its ".".
                    self._pub = None
                    self._begin_message(e)
                    continue
                return e
            if isinstance(cmd, PublishStart):
                self._pub = cmd
                self._reply = cmd.kind == "REPLY"
                self._begin_message()
                continue
            return cmd

    def _finish_publish(self) -> Publish | ProtocolError:
        headers, sections, error = self._take_message()
        pub = self._pub
        self._pub = None
        if error is not None:
            return error
        if pub is None:  # pragma: no cover - a PUB line error is always recorded
            return ProtocolError()
        # The attributes were checked line by line (validate_publish_headers' rules).
        return Publish(pub.kind, pub.topic, pub.cmuid, Message(headers, sections))
