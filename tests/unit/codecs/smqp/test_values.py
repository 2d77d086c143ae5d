"""Value syntax (profile section 4): topics, patterns, date-times, timeouts, keywords,
booleans and smuids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.smqp.errors import ProtocolError
from broker.smqp.values import (
    SmuidSet,
    TopicPattern,
    format_bool,
    format_datetime,
    format_keywords,
    format_smuid_ranges,
    format_timeout,
    is_reserved_segment,
    parse_bool,
    parse_datetime,
    parse_int,
    parse_keywords,
    parse_reply_smuid,
    parse_smuid_header,
    parse_smuid_list,
    parse_timeout,
    parse_topic_pattern,
    topic_key,
    validate_keyword,
    validate_topic,
)


def _bad(fn, *args, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args, **kwargs)
    assert info.value.code == 400
    return info.value


# ---------------------------------------------------------------------------------- topics


@pytest.mark.parametrize(
    "topic",
    [
        "/stocks",
        "/stocks/quotes/ibm",
        "/weather/us/ca/san/forecast",
        "/a/Trash",
        "/big_blue",
        "/x1/y2_3",
        "/Ünïcödé/наука/株式",
    ],
)
def test_valid_topics(topic: str) -> None:
    assert validate_topic(topic) is topic


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "/",
        "stocks",
        "/stocks/",
        "//stocks",
        "/stocks//ibm",
        "/1stocks",
        "/_stocks",
        "/stocks/ibm quote",
        "/stocks-ibm",
        "/stocks/*",
        "/stocks.ibm",
        "/stocks\t",
        "/²",
        "/stocks/\u00a0",
    ],
)
def test_invalid_topics(topic: str) -> None:
    err = _bad(validate_topic, topic)
    assert err.text == "Bad request (invalid topic)"


def test_root_topic_only_when_allowed() -> None:
    assert validate_topic("/", allow_root=True) == "/"
    _bad(validate_topic, "/")


def test_topic_key_and_trash() -> None:
    assert topic_key("/Stocks/IBM") == topic_key("/stocks/ibm")
    assert is_reserved_segment("Trash")
    assert is_reserved_segment("TRASH")
    assert is_reserved_segment("trash")
    assert not is_reserved_segment("Trashcan")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("/stocks", TopicPattern("/stocks", False)),
        ("/stocks/*", TopicPattern("/stocks", True)),
        ("/stocks/quotes/*", TopicPattern("/stocks/quotes", True)),
        ("/*", TopicPattern("/", True)),
    ],
)
def test_topic_patterns(text: str, pattern: TopicPattern) -> None:
    assert parse_topic_pattern(text) == pattern
    assert str(pattern) == text


def test_bare_star_only_when_allowed() -> None:
    assert parse_topic_pattern("*", allow_bare_star=True) == TopicPattern("", True)
    assert str(TopicPattern("", True)) == "*"
    _bad(parse_topic_pattern, "*")


@pytest.mark.parametrize("text", ["/stocks/*/ibm", "/stocks*", "/stocks/**", "**", "/", ""])
def test_bad_patterns(text: str) -> None:
    _bad(parse_topic_pattern, text)


def test_root_pattern_when_allowed() -> None:
    assert parse_topic_pattern("/", allow_root=True) == TopicPattern("/", False)


# ------------------------------------------------------------------------------ date-time


def test_format_datetime_profile_example() -> None:
    dt = datetime(2001, 8, 23, 14, 45, 12, 460000, tzinfo=UTC)
    assert format_datetime(dt) == "D08232001T14451246Z"


def test_format_datetime_truncates() -> None:
    dt = datetime(2001, 8, 23, 14, 45, 12, 469999, tzinfo=UTC)
    assert format_datetime(dt) == "D08232001T14451246Z"


def test_format_datetime_converts_to_utc() -> None:
    from datetime import timedelta, timezone

    dt = datetime(2001, 8, 23, 16, 45, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    assert format_datetime(dt) == "D08232001T14451200Z"
    assert format_datetime(datetime(2001, 8, 23, 14, 45, 12)) == "D08232001T14451200Z"


@pytest.mark.parametrize(
    ("text", "micro"),
    [
        ("D08232001T14451246Z", 460000),
        ("D08232001T144512Z", 0),
        ("D08232001T1445124Z", 400000),
        ("D08232001T144512123456Z", 123456),
        ("D08232001T14451246", 460000),  # the draft's GET example has no Z
        ("d08232001t14451246z", 460000),
        ("2001-08-23T14:45:12.46Z", 460000),
        ("2001-08-23T14:45:12.46+00:00", 460000),
        ("2001-08-23T14:45:12Z", 0),
        ("2001-08-23T14:45:12", 0),
        ("2001-08-23T16:45:12.46+02:00", 460000),
    ],
)
def test_parse_datetime(text: str, micro: int) -> None:
    dt = parse_datetime(text)
    assert dt == datetime(2001, 8, 23, 14, 45, 12, micro, tzinfo=UTC)
    assert dt.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "",
        "D08232001T1445121234567Z",
        "D13232001T14451246Z",
        "D08322001T14451246Z",
        "D08232001T25451246Z",
        "D0823200T14451246Z",
        "D08232001 14451246Z",
        "2001-08-23",
        "2001-13-23T14:45:12Z",
        "D\uff10\uff18232001T14451246Z",
        "yesterday",
    ],
)
def test_parse_datetime_invalid(text: str) -> None:
    assert _bad(parse_datetime, text).text == "Bad request (invalid date-time)"


# -------------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:01:00", 60),
        ("00:00:00", 0),
        ("01:02:03", 3723),
        ("48:00:00", 172800),
        ("00:24:00:00", 86400),
        ("01:24:00:00", 172800),
        ("01:12:00:00", 129600),
        ("02:03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("-1", -1),
        ("-5", -1),
        ("-00:00:01", -1),
        ("-0", 0),
    ],
)
def test_parse_timeout(text: str, seconds: int) -> None:
    assert parse_timeout(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "60",
        "1:60:00",
        "00:00:60",
        "00:01",
        "a:b:c",
        "--1",
        "-",
        "00:01:00 ",
        "1.5",
        "24856:00:00:00",
        "596524:00:00",
    ],
)
def test_parse_timeout_invalid(text: str) -> None:
    assert _bad(parse_timeout, text).text == "Bad request (invalid timeout)"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (60, "00:01:00"),
        (0, "00:00:00"),
        (86399, "23:59:59"),
        (86400, "00:24:00:00"),
        (2 * 86400, "01:24:00:00"),
        (36 * 3600, "01:12:00:00"),
        (86400 + 61, "00:24:01:01"),
        (-1, "-1"),
        (-99, "-1"),
    ],
)
def test_format_timeout(seconds: int, text: str) -> None:
    assert format_timeout(seconds) == text


# -------------------------------------------------------------------------------- keywords


def test_keywords() -> None:
    assert parse_keywords("(IBM,STOCKS,QUOTE,BIG BLUE)") == ("IBM", "STOCKS", "QUOTE", "BIG BLUE")
    assert parse_keywords("(BLUE)") == ("BLUE",)
    assert parse_keywords("()") == ()
    assert parse_keywords("( )") == ()
    assert parse_keywords("( a , b )") == ("a", "b")
    assert parse_keywords("(a,,b)") == ("a", "b")
    assert format_keywords(("A", "BIG BLUE")) == "(A,BIG BLUE)"
    assert format_keywords(()) == "()"


@pytest.mark.parametrize("text", ["", "IBM", "(IBM", "IBM)", "(a/b)", "(a\\b)", "(a(b)", "(a)b)"])
def test_bad_keywords(text: str) -> None:
    _bad(parse_keywords, text)


@pytest.mark.parametrize("kw", ["", " a", "a ", "a/b", "a\\b", "a,b", "a(b", "a)b", "a\nb"])
def test_bad_keyword(kw: str) -> None:
    assert _bad(validate_keyword, kw).text == "Bad request (invalid keyword)"


# -------------------------------------------------------------------------------- booleans


def test_booleans() -> None:
    assert parse_bool("yes") is True
    assert parse_bool("YES") is True
    assert parse_bool("No") is False
    assert format_bool(True) == "YES"
    assert format_bool(False) == "NO"
    _bad(parse_bool, "true")
    _bad(parse_bool, "")


# --------------------------------------------------------------------------------- smuids


def test_smuid_lists() -> None:
    assert parse_smuid_list("1809") == SmuidSet(((1809, 1809),))
    assert parse_smuid_list("1809-1812") == SmuidSet(((1809, 1812),))
    s = parse_smuid_list("1845-1890,1905,1920-1930")
    assert s.ranges == ((1845, 1890), (1905, 1905), (1920, 1930))
    assert str(s) == "1845-1890,1905,1920-1930"
    assert 1850 in s and 1905 in s and 1930 in s
    assert 1900 not in s and 1 not in s
    every = parse_smuid_list("*")
    assert every.all and str(every) == "*" and 123456 in every


@pytest.mark.parametrize("text", ["", "0", "-1", "5-3", "1,,2", "a", "1-", "-", "1 2", "١٢"])
def test_bad_smuid_lists(text: str) -> None:
    assert _bad(parse_smuid_list, text).text == "Bad request (invalid smuid list)"


def test_format_smuid_ranges() -> None:
    assert format_smuid_ranges([1809, 1810, 1811, 1812, 1845]) == "1809-1812,1845"
    assert format_smuid_ranges([5, 3, 4, 4, 10]) == "3-5,10"
    assert format_smuid_ranges([]) == ""
    assert format_smuid_ranges([7]) == "7"


def test_smuid_header() -> None:
    assert parse_smuid_header("www.host.com/1835") == ("www.host.com", 1835)
    assert parse_smuid_header("www.domain.com/orange/12") == ("www.domain.com/orange", 12)
    for bad in ("1835", "/1835", "host/", "host/0", "host/x", "ho st/1"):
        assert _bad(parse_smuid_header, bad).text == "Bad request (invalid smuid)"


def test_reply_smuid_may_be_bare() -> None:
    # Profile §9.1: a reply's Smuid is host/number or a bare number.
    assert parse_reply_smuid("1835") == 1835
    assert parse_reply_smuid("www.host.com/1835") == 1835
    for bad in ("0", "/1835", "host/", "x", "ho st/1", "-3"):
        assert _bad(parse_reply_smuid, bad).text == "Bad request (invalid smuid)"


def test_parse_int() -> None:
    assert parse_int("12") == 12
    assert parse_int("-1", minimum=-1) == -1
    for bad in ("", "+1", " 1", "1_000", "\u0661", "99999999999999999999", "0x1"):
        _bad(parse_int, bad)
    _bad(parse_int, "0", minimum=1)
