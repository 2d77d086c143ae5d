"""NOTIFY SUBSCRIPTION (profile §9.3): the bytes the server writes and the client's reading of
them, whatever the chunks."""

from __future__ import annotations

import pytest

from broker.smqp.client import NEED_DATA, ClientConnection, Greeting, NotifySubscription
from broker.smqp.errors import ProtocolError
from broker.smqp.replies import serialize_greeting, serialize_notify_subscription


def test_the_exact_bytes() -> None:
    assert serialize_notify_subscription("/stocks/*", "CANCELLED", "lease") == (
        b"NOTIFY SUBSCRIPTION /stocks/*\r\nAction: CANCELLED\r\nReason: lease\r\n\r\n")


def test_a_line_break_cannot_be_smuggled_in() -> None:
    with pytest.raises(ValueError):
        serialize_notify_subscription("/t\r\nNOTIFY", "CANCELLED", "lease")


def _read(data: bytes, chunk: int) -> list:
    conn = ClientConnection()
    stream = serialize_greeting("test") + data
    events = []
    for i in range(0, len(stream), chunk):
        conn.receive_data(stream[i:i + chunk])
        while (event := conn.next_event()) is not NEED_DATA:
            events.append(event)
    return events


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("reason", ["lease", "revoked", "removed"])
def test_the_client_reads_it(chunk: int, reason: str) -> None:
    data = serialize_notify_subscription("/t/*", "CANCELLED", reason)
    greeting, note = _read(data, chunk)
    assert isinstance(greeting, Greeting)
    assert note == NotifySubscription("/t/*", "CANCELLED", reason)


def test_without_action_it_is_refused() -> None:
    with pytest.raises(ProtocolError):
        _read(b"NOTIFY SUBSCRIPTION /t\r\nReason: lease\r\n\r\n", 1000)
