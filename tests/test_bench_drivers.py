"""The benchmark's subscriber drivers (:mod:`bench.drivers`): nothing delivered is dropped.

A driver subscribes in ``connect()``, and the broker may deliver (and the driver ACK)
before the benchmark starts listening: a publisher in another process may already be
sending. Those deliveries must still be counted, or the run reports a confirmed message as
missing (it did, for RabbitMQ's first message).
"""

from __future__ import annotations

from bench.drivers import Subscriber


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
