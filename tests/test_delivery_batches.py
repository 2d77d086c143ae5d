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


def test_two_batches_go_at_once_and_more_only_when_large(monkeypatch):
    monkeypatch.setattr(delivery, "EXTRA_BATCH_MIN", 32)
    # Up to two: whatever is queued.
    assert delivery._may_send(0, 4, 1) and delivery._may_send(1, 4, 1)
    # A third and fourth: only a batch of 32 or more (a few publishes wait and grow).
    assert not delivery._may_send(2, 4, 31)
    assert delivery._may_send(2, 4, 32) and delivery._may_send(3, 4, 500)
    # Never beyond the limit.
    assert not delivery._may_send(4, 4, 500)
    # Where commits wait for the disk (PostgreSQL): one at a time, however many are queued.
    assert delivery._may_send(0, 1, 1)
    assert not delivery._may_send(1, 1, 500)
