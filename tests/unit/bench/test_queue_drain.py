"""The ``queue`` benchmark's harness logic (:mod:`bench.queue_drain`), without a server:
its options, its cases and rounds, the item numbering, the tally, the time budget, the
SMQP worker's wire logic, and the summary with its spread and ratios."""

from __future__ import annotations

import argparse
import base64
import math
import threading
import time

import pytest

from bench import queue_drain as q
from bench.__main__ import build_parser
from bench.stats import spread


def notify(number: int) -> bytes:
    body = q.item_body(number, 64)
    return (b"NOTIFY MESSAGE /bench/q1 bench.example.net/1 root/g/c%d\r\n"
            b"Created: D11262026T09000000Z\r\n\r\n"
            b"Content-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s\r\n.\r\n"
            % (number, len(body), body))


# ------------------------------------------------------------------------------ options


def test_the_queue_options_parse_with_their_defaults():
    args = build_parser().parse_args(["queue"])
    assert (args.items, args.size, args.workers, args.rounds) == (5000, 256, 4, 3)
    assert args.windows == (1, 16)
    assert args.cases == q.DOORS + q.PEERS
    assert args.db == "both"
    args = build_parser().parse_args(["queue", "--windows", "1,64", "--cases", "smqp,nats",
                                      "--budget", "20", "--db", "sqlite"])
    assert (args.windows, args.cases, args.budget, args.db) == ((1, 64), ("smqp", "nats"),
                                                               20.0, "sqlite")


@pytest.mark.parametrize("text", ["", "0,16", "1,1", "1,x", "-4"])
def test_bad_windows_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        q.parse_windows(text)


@pytest.mark.parametrize("text", ["", "smqp,kafka", "mqtt"])
def test_unknown_case_kinds_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        q.parse_kinds(text)


def test_bad_options_exit_with_a_message_not_a_traceback(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["queue", "--windows", "0"])
    assert "windows must be" in capsys.readouterr().err


# -------------------------------------------------------------------------- cases, rounds


def test_smqp_runs_once_and_every_other_kind_once_per_window():
    names = [c.name for c in q.build_cases(("smqp", "xmpp", "rest", "rabbitmq", "nats"),
                                           (1, 16))]
    assert names == ["smqp", "xmpp q=1", "xmpp q=16", "rest b=1", "rest b=16",
                     "rest-each b=1", "rest-each b=16",
                     "rabbitmq p=1", "rabbitmq p=16", "nats b=1", "nats b=16"]


def test_rest_brings_its_ack_per_item_variant_which_also_runs_alone():
    assert [c.name for c in q.build_cases(("rest",), (16,))] == ["rest b=16",
                                                                  "rest-each b=16"]
    assert [c.name for c in q.build_cases(("rest-each",), (1,))] == ["rest-each b=1"]


def test_rounds_alternate_their_order():
    cases = q.build_cases(("smqp", "rabbitmq"), (1,))
    assert q.round_order(cases, 0) == cases
    assert q.round_order(cases, 1) == cases[::-1]
    assert q.round_order(cases, 2) == cases


@pytest.mark.parametrize("size", [64, 256, 1000])
def test_an_item_body_has_its_size_and_number(size):
    body = q.item_body(4242, size)
    assert len(body) == size
    assert q.item_number(body) == 4242
    assert q.item_number(body.decode()) == 4242
    assert q.item_number(b"<job/>") is None
    # As ElementTree writes it back (an XMPP item's payload): double quotes.
    assert q.item_number(b'<ns0:job xmlns:ns0="urn:bench" n="00000007">x</ns0:job>') == 7


def test_a_pulled_rest_message_gives_its_item_number_from_text_or_base64():
    body = q.item_body(31, 256)
    assert q.rest_item_number({"sections": [
        {"content_type": "application/xml", "base64": base64.b64encode(body).decode()}]}) == 31
    assert q.rest_item_number({"sections": [{"text": body.decode()}]}) == 31
    assert q.rest_item_number({"sections": []}) is None


# --------------------------------------------------------------------------------- tally


def test_the_tally_counts_distinct_items_and_reports_a_second_consumption():
    tally = q.Tally(3)
    tally.consumed(0)
    tally.consumed(1)
    tally.consumed(1)
    assert (tally.count, tally.duplicates, tally.done.is_set()) == (2, 1, False)
    tally.consumed(None)  # a consumption whose body had no number still counts
    assert (tally.count, tally.done.is_set()) == (3, True)


def test_a_drain_that_finishes_reports_its_rate_and_elapsed_time():
    def worker(tally: q.Tally, stop: threading.Event) -> None:
        for number in range(50):
            tally.consumed(number)

    outcome = q.drain("fake", 50, 10.0, [worker])
    assert outcome.complete and outcome.consumed == 50
    assert outcome.seconds < 5 and outcome.per_second > 10
    assert "50 in" in outcome.describe()


def test_a_drain_that_consumes_nothing_stops_at_its_budget_and_says_so():
    def idle(tally: q.Tally, stop: threading.Event) -> None:
        stop.wait()

    started = time.monotonic()
    outcome = q.drain("idle", 100, 0.5, [idle, idle])
    assert time.monotonic() - started < 5
    assert not outcome.complete and outcome.consumed == 0 and outcome.per_second == 0
    assert "only 0 of 100 consumed in" in outcome.describe()
    assert "budget" in outcome.describe()


def test_a_drain_whose_workers_all_fail_ends_early_with_their_errors():
    def broken(tally: q.Tally, stop: threading.Event) -> None:
        tally.consumed(7)
        raise ConnectionError("stream closed by the server")

    started = time.monotonic()
    outcome = q.drain("broken", 100, 30.0, [broken] * 4)
    assert time.monotonic() - started < 10
    assert not outcome.complete and outcome.consumed == 1 and outcome.duplicates == 3
    assert outcome.errors[0] == "worker 0: ConnectionError: stream closed by the server"
    assert "every worker stopped" in outcome.describe()
    assert "CONSUMED TWICE" in outcome.describe()


# ---------------------------------------------------------------------- SMQP worker logic


def test_a_notify_before_the_login_answer_is_acked_and_counted():
    tally = q.Tally(2)
    session = q.AckingSession(tally)
    out = session.feed(b"200 LOGIN ok\r\n" + notify(0)[:40])
    assert out == b""
    out = session.feed(notify(0)[40:] + b"200-Max-Window: 1\r\n200 Guid: g\r\n")
    assert out == b"310 ACK\r\n"
    assert tally.count == 0  # not consumed until the server answers the ACK
    out = session.feed(b"310 ACK\r\n" + notify(1))
    assert (out, tally.count) == (b"310 ACK\r\n", 1)
    session.feed(b"310 ACK\r\n")
    assert (tally.count, tally.seen, tally.done.is_set()) == (2, {0, 1}, True)


def test_a_refused_login_raises_and_a_refused_ack_is_an_error():
    with pytest.raises(ConnectionError, match="login refused"):
        q.AckingSession(q.Tally(1)).feed(b"200 LOGIN ok\r\n401 Unauthorized\r\n")
    tally = q.Tally(1)
    session = q.AckingSession(tally)
    session.feed(b"200 ok\r\n200 ok\r\n" + notify(3))
    session.feed(b"409 Conflict (lock lost)\r\n")
    assert tally.count == 0 and tally.errors == ["ACK refused: 409 Conflict (lock lost)"]
    assert session.in_flight == []


# ------------------------------------------------------------------------------ summary


def outcome(case: str, rate: float, complete: bool = True) -> q.Outcome:
    return q.Outcome(case, 100, int(rate), 1.0, complete, 60.0)


def test_spread_is_median_min_and_max():
    assert spread([3.0, 1.0, 2.0, 10.0]) == (2.5, 1.0, 10.0)
    assert all(math.isnan(v) for v in spread([]))


def test_the_summary_takes_median_and_spread_per_case_and_ratios_to_each_peer():
    cases = q.build_cases(("smqp", "rabbitmq"), (1,))
    outcomes = [outcome("smqp", 100), outcome("smqp", 300), outcome("smqp", 200, False),
                outcome("rabbitmq p=1", 1000), outcome("rabbitmq p=1", 400)]
    rows = q.summarize(outcomes, cases)
    assert [(r["case"], r["median"], r["min"], r["max"], r["complete"], r["rounds"])
            for r in rows] == [("smqp", 200, 100, 300, 2, 3),
                               ("rabbitmq p=1", 700, 400, 1000, 2, 2)]
    assert q.ratios(rows) == [{"case": "smqp", "rabbitmq p=1": pytest.approx(200 / 700)}]


def test_a_peer_that_consumed_nothing_gives_no_ratio():
    cases = q.build_cases(("smqp", "nats"), (1,))
    rows = q.summarize([outcome("smqp", 50), outcome("nats b=1", 0, False)], cases)
    assert q.ratios(rows) == [{"case": "smqp"}]


def test_a_window_is_asked_after_the_login_and_a_refusal_stops_the_worker():
    assert q.AckingSession(q.Tally(1)).opening("w1") == (
        b"LOGIN w1 CLEAR/1.0\r\nPASS w1 pw\r\n")
    session = q.AckingSession(q.Tally(1), window=16)
    assert session.opening("w1").endswith(b"PASS w1 pw\r\nSET NOTIFY WINDOW 16\r\n")
    with pytest.raises(ConnectionError, match="SET NOTIFY WINDOW 16 refused: 400 Bad"):
        session.feed(b"200 ok\r\n200 ok\r\n400 Bad request\r\n")


def test_with_a_window_several_notifies_are_acked_oldest_first():
    tally = q.Tally(3)
    session = q.AckingSession(tally, window=16)
    out = session.feed(b"200 ok\r\n200 ok\r\n" + notify(5) + b"200 OK\r\n" + notify(6)
                       + notify(7))
    assert out == b"310 ACK\r\n" * 3
    session.feed(b"310 ACK\r\n409 Conflict\r\n310 ACK\r\n")
    assert tally.seen == {5, 7} and tally.errors == ["ACK refused: 409 Conflict"]


def test_smqp_windows_above_one_are_cases_of_their_own():
    names = [c.name for c in q.build_cases(("smqp", "nats"), (1, 64), (1, 16))]
    assert names == ["smqp", "smqp w=16", "nats b=1", "nats b=64"]
    args = build_parser().parse_args(["queue", "--smqp-windows", "1,64"])
    assert args.smqp_windows == (1, 64)
    assert build_parser().parse_args(["queue"]).smqp_windows == (1,)


def test_the_summary_prints_ratios_only_when_a_peer_ran(capsys):
    cases = q.build_cases(("smqp", "rabbitmq"), (1,))
    rows = q.summarize([outcome("smqp", 50)], cases)
    q.print_summary("sqlite", rows, q.ratios(rows))
    assert "peer median" not in capsys.readouterr().out
    rows = q.summarize([outcome("smqp", 50), outcome("rabbitmq p=1", 500)], cases)
    q.print_summary("sqlite", rows, q.ratios(rows))
    out = capsys.readouterr().out
    assert "broker median / peer median" in out and "0.1" in out


def test_a_case_whose_setup_failed_says_so():
    failed = q.Outcome("smqp", 100, 0, 2.0, False, 60.0, errors=["before the drain: x"],
                       reason="setup failed")
    assert "only 0 of 100 consumed in 2 s: setup failed" in failed.describe()
