"""The ``messages`` benchmark's peers (issue 39, item 1), without a server: which peer
targets are built from the options, what each runs, the NATS names, the own Mosquitto's
configuration, and the SMQP/peer ratios."""

from __future__ import annotations

import pytest

from bench import messages
from bench.__main__ import build_parser
from bench.drivers import (
    MqttPublisher,
    MqttSubscriber,
    NatsPublisher,
    NatsSubscriber,
    RabbitSubscriber,
    make_publisher,
    make_subscriber,
    nats_names,
)


def test_the_peer_options_default_to_prefetch_and_batch_1_and_64():
    args = build_parser().parse_args(["messages"])
    assert (args.rabbitmq, args.nats, args.mosquitto) == (True, True, True)
    assert args.rabbitmq_prefetch == (1, 64) and args.nats_batch == (1, 64)
    assert args.nats_port == 4222
    args = build_parser().parse_args(["messages", "--no-nats", "--no-mosquitto",
                                      "--rabbitmq-prefetch", "16"])
    assert (args.nats, args.mosquitto, args.rabbitmq_prefetch) == (False, False, (16,))


def test_a_peers_second_window_runs_only_the_scenarios_with_a_subscriber():
    args = build_parser().parse_args(["messages"])
    first, second = messages.rabbit_target(args, 1), messages.rabbit_target(args, 64, False)
    assert (first.label, first.scenarios) == ("rabbitmq-p1", None)
    assert (second.label, second.scenarios) == ("rabbitmq-p64", ("e2e", "latency"))
    assert second.make_spec("e2e").window == 64
    nats = messages.nats_target(args, 64, False)
    assert (nats.label, nats.broker, nats.scenarios) == ("nats-b64", "nats", ("e2e", "latency"))
    spec = nats.make_spec("e2e")
    assert (spec.kind, spec.port, spec.window) == ("nats", 4222, 64)


def test_smqp_runs_with_a_window_of_1_then_64_the_second_with_a_subscriber_only():
    """Issue 39 item 2: the SMQP subscriber's SET NOTIFY WINDOW, beside RabbitMQ's prefetch."""
    from types import SimpleNamespace

    assert build_parser().parse_args(["messages"]).smqp_window == (1, 64)
    broker = SimpleNamespace(host="127.0.0.1", port=7200, backend="postgres", pid=1)
    first = messages.smqp_target(broker)
    second = messages.smqp_target(broker, window=64, first=False)
    assert (first.label, first.scenarios) == ("smqp-postgres", None)
    assert (second.label, second.broker, second.scenarios) == (
        "smqp-postgres-w64", "smqp", ("e2e", "latency"))
    assert (first.make_spec("e2e").window, second.make_spec("e2e").window) == (1, 64)
    tls = messages.smqp_target(broker, (7443, "ca.pem"), 64, first=False)
    assert tls.label == "smqp-postgres-tls-w64" and tls.make_spec("e2e").port == 7443


def test_each_peer_kind_has_its_drivers():
    args = build_parser().parse_args(["messages"])
    spec = messages.nats_target(args).make_spec("e2e")
    assert isinstance(make_publisher(spec, 0), NatsPublisher)
    assert isinstance(make_subscriber(spec), NatsSubscriber)
    mqtt = messages.mosquitto_target(1883, 1).make_spec("e2e")
    assert isinstance(make_publisher(mqtt, 0), MqttPublisher)
    assert isinstance(make_subscriber(mqtt), MqttSubscriber)
    assert isinstance(make_subscriber(messages.rabbit_target(args).make_spec("e2e")),
                      RabbitSubscriber)
    with pytest.raises(ValueError):
        make_subscriber(spec.__class__(kind="kafka", host="h", port=1, target="t"))


def test_nats_names_are_valid_stream_and_subject_tokens():
    stream, subject = nats_names("e2e-ab/c.d*>")
    assert stream == "SMQPBENCHe2eabcd" and subject == "smqpbench.e2eabcd"


def test_the_own_mosquitto_has_no_queue_limit():
    conf = messages.MOSQUITTO_CONF.format(port=18830)
    assert "listener 18830 127.0.0.1" in conf
    assert "max_queued_messages 0" in conf and "max_queued_bytes 0" in conf


def run(target: str, broker: str, scenario: str, rate: float, p50: float | None = None
        ) -> dict:
    latency = {"p50": p50, "p99": p50 and 2 * p50}
    return {"target": target, "broker": broker, "scenario": scenario, "msgs_per_s": rate,
            "latency_ms": latency}


def test_ratios_are_every_smqp_run_over_every_peer_run_of_the_same_scenario():
    runs = [run("smqp-sqlite", "smqp", "e2e", 1000, 4.0),
            run("smqp-sqlite", "smqp", "publish", 3000),
            run("rabbitmq-p1", "rabbitmq", "e2e", 500, 2.0),
            run("nats-b64", "nats", "e2e", 4000, 1.0),
            run("nats-b1", "nats", "publish", 0)]
    ratios = messages.peer_ratios(runs)
    assert [(r["scenario"], r["peer"], r["msgs_per_s"], r["latency_p50"]) for r in ratios] \
        == [("e2e", "rabbitmq-p1", 2.0, 2.0), ("e2e", "nats-b64", 0.25, 4.0),
            ("publish", "nats-b1", None, None)]
