"""SET NOTIFY PORT (profile §4.5): the connection the server opens back to the client's own
address, where an SMQP session's notifications go instead of its own connection, and where
the client's ``310 ACK`` lines are read. The door (:mod:`broker.consumers.smqp`) owns one at
a time and answers each ``310 ACK`` read here as it answers the command on the session
(:meth:`~broker.consumers.smqp.SMQPConsumer.answer_ack`): one ACK path for both."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from broker.domain.errors import ProtocolError
from broker.services import ServiceError
from broker.smqp import commands as c
from broker.smqp.replies import serialize_reply

#: The client's ``310 ACK`` answered: (reply code, text, whether the next message may go).
AckAnswer = tuple[int, str, bool]


class NotifyPort:
    """One connection back to the client: written to by the door, read for ``310 ACK``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 answer_ack: Callable[[int | None], Awaitable[AckAnswer]],
                 next_may_go: Callable[[], None], gone: Callable[[NotifyPort], None],
                 closing: Callable[[], bool]) -> None:
        self._writer = writer
        self._answer_ack = answer_ack
        self._next_may_go = next_may_go
        self._gone = gone
        self._closing = closing
        self._task = asyncio.ensure_future(self._read(reader))

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float,
                      **callbacks: Callable) -> NotifyPort | None:
        """Connect to the client's ``port``; None when that fails within ``timeout``."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                    timeout)
        except (TimeoutError, OSError):
            return None
        return cls(reader, writer, **callbacks)

    async def write(self, data: bytes) -> bool:
        """Write a notification; False when the connection is gone (the door closes it)."""
        writer = self._writer
        if writer.is_closing():  # gone: the retry timer sends the notification again
            return False
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    def close(self) -> None:
        self._writer.close()
        self._task.cancel()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        writer = self._writer
        try:
            while not self._closing():
                line = await reader.readline()
                if not line:
                    break
                text = line.strip().upper()
                if not text:
                    continue
                if writer.is_closing():
                    break
                ack = notify_port_ack(text)
                if isinstance(ack, c.Ack):
                    try:
                        code, reply, next_may_go = await self._answer_ack(ack.smuid)
                    except ServiceError as exc:  # as the door's error funnel words it
                        code, reply, next_may_go = exc.code, exc.text, False
                    writer.write(serialize_reply(code, reply))
                    if next_may_go:
                        self._next_may_go()
                elif isinstance(ack, ProtocolError):
                    writer.write(serialize_reply(ack.code, ack.text))
                else:
                    writer.write(b"400 Bad request (only 310 ACK is read on this connection)\r\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # The client's listener went away: notifications return to the session.
            self._gone(self)
            writer.close()


def notify_port_ack(line: bytes) -> c.Ack | ProtocolError | None:
    """A line read on the SET NOTIFY PORT connection: the ``310 ACK [<smuid>]`` it holds (profile
    §9.7), its refusal when malformed, None when it is something else."""
    if line != b"310 ACK" and not line.startswith(b"310 ACK "):
        return None
    try:
        command = c.parse_command_line(line.decode("ascii"))
    except UnicodeDecodeError:
        return ProtocolError(400, "Bad request")
    except ProtocolError as exc:
        return exc
    return command if isinstance(command, c.Ack) else None
