"""The benchmark's subscriber drivers (:mod:`bench.drivers`): nothing delivered is dropped.

A driver subscribes in ``connect()``, and the broker may deliver (and the driver ACK)
before the benchmark starts listening: a publisher in another process may already be
sending. Those deliveries must still be counted, or the run reports a confirmed message as
missing (it did, for RabbitMQ's first message).
"""

from __future__ import annotations

import pytest

from bench.client import SMQPProtocolError
from bench.drivers import Subscriber, SubscriberFramer
from broker.smqp.message import DataSection, Message
from broker.smqp.replies import serialize_notify_message, serialize_notify_topic


class Stub(Subscriber):
    async def connect(self) -> None:  # deliveries are driven by the test
        return None

    async def close(self) -> None:
        return None


def test_deliveries_before_listen_go_to_the_listener_first_and_in_order():
    subscriber = Stub()
    subscriber.on_message(b"first", 1)  # as a driver does on a delivery
    subscriber.on_message(b"second", 2)
    seen: list[tuple[bytes, int]] = []
    subscriber.listen(lambda body, received_ns: seen.append((body, received_ns)))
    assert seen == [(b"first", 1), (b"second", 2)]
    subscriber.on_message(b"third", 3)
    assert seen == [(b"first", 1), (b"second", 2), (b"third", 3)]


def test_nothing_held_is_given_twice():
    subscriber = Stub()
    subscriber.on_message(b"early", 1)
    first: list[bytes] = []
    subscriber.listen(lambda body, _: first.append(body))
    second: list[bytes] = []
    subscriber.listen(lambda body, _: second.append(body))
    assert (first, second) == ([b"early"], [])


def _stream() -> tuple[bytes, list[tuple[str, bytes]]]:
    """What a subscriber may receive (as the server serialises it), and its events."""
    tricky = b"a\r\n.\r\n\r\n\r\nContent-Length: 9\r\nb"  # framing bytes inside data
    two = Message([("Created", "D11242026T04000000Z"), ("X-Note", "two sections")],
                  [DataSection([("Content-Type", "application/octet-stream"),
                                ("Content-Length", str(len(tricky)))], tricky),
                   DataSection([("Content-Type", "text/plain"), ("Content-Length", "2")],
                               b"ok")])
    none = Message([("Created", "D11242026T04000000Z")], [])
    stream = (serialize_notify_message("/t", "ctx/1", "p/g/c1", two)
              + b"310 ACK\r\n"
              + serialize_notify_topic("/t/new", "ADDED")
              + serialize_notify_message("/t", "ctx/2", "p/g/c2", none)
              + b"400 Bad request (no message is waiting for 310 ACK)\r\n")
    events = [("message", tricky), ("ack", b""), ("notify", b""), ("message", b""),
              ("reply", b"400 Bad request (no message is waiting for 310 ACK)")]
    return stream, events


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 10_000])
def test_the_subscriber_framer_frames_by_content_length_whatever_the_chunks(chunk):
    stream, expected = _stream()
    framer = SubscriberFramer()
    events: list[tuple[str, bytes]] = []
    for i in range(0, len(stream), chunk):
        events += framer.feed(stream[i:i + chunk])
    assert events == expected


def test_the_subscriber_framer_refuses_a_section_without_its_length():
    framer = SubscriberFramer()
    with pytest.raises(SMQPProtocolError):
        framer.feed(b"NOTIFY MESSAGE /t\r\nSmuid: c/1\r\n\r\n"
                    b"Content-Type: text/plain\r\n\r\nabc\r\n.\r\n")
