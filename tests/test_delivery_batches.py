"""How the dispatcher cuts queued publishes into group commits (:func:`_batch_size`)."""

from __future__ import annotations

from broker import delivery
from broker.services.messages import PublishRequest
from broker.smqp.message import DataSection, Message


def queued(*sizes: int) -> list:
    return [(PublishRequest(1, "g", "MESSAGE", "/t", f"c{i}",
                            Message([], [DataSection([], b"x" * size)])), None)
            for i, size in enumerate(sizes)]


def test_a_batch_stops_before_the_byte_limit(monkeypatch):
    monkeypatch.setattr(delivery, "MAX_BATCH_BYTES", 100)
    assert delivery._batch_size(queued(40, 40, 40, 40), 10) == 2
    assert delivery._batch_size(queued(40, 60, 1), 10) == 2  # exactly the limit fits


def test_a_message_over_the_limit_goes_alone(monkeypatch):
    monkeypatch.setattr(delivery, "MAX_BATCH_BYTES", 100)
    assert delivery._batch_size(queued(500, 1, 1), 10) == 1
    assert delivery._batch_size(queued(1, 500, 1), 10) == 1


def test_the_count_limit_still_holds(monkeypatch):
    monkeypatch.setattr(delivery, "MAX_BATCH_BYTES", 10**9)
    assert delivery._batch_size(queued(*[10] * 50), 8) == 8
    assert delivery._batch_size(queued(10, 10), 8) == 2
    assert delivery._batch_size([], 8) == 0
