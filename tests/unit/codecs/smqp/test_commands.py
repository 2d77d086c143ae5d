"""Command lines: every form and abbreviation of the draft's section 4 examples, and the
error paths of the command parser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.smqp.commands import (
    Ack,
    Count,
    CreateTopic,
    FindTopic,
    GetMessage,
    GetTopicKeywords,
    ListMessage,
    ListTopic,
    Login,
    Noop,
    Pass,
    Publish,
    PublishStart,
    Quit,
    RawLine,
    RemoveMessage,
    RemoveTopic,
    Republish,
    SetLogin,
    SetNotifyPort,
    SetNotifyResume,
    SetNotifySuspend,
    SetNotifyWindow,
    SetTopicKeywords,
    SetTopicName,
    Subscribe,
    Unsubscribe,
    is_publish_line,
    parse_command_line,
    serialize_command,
)
from broker.smqp.errors import ProtocolError
from broker.smqp.message import DataSection, Message
from broker.smqp.values import SmuidSet, TopicPattern

P = TopicPattern
IBM = "/stocks/quotes/ibm"

# (line as in the draft, expected command)
DRAFT_EXAMPLES = [
    ("LOGIN jtegen CLEAR/1.0", Login("jtegen", "CLEAR", "1.0")),
    ("LOGIN jtegen KERBEROS/4.0", Login("jtegen", "KERBEROS", "4.0")),
    ("PASS jtegen mypasswd", Pass("jtegen", "mypasswd")),
    ("PASS jtegen rowe7kuy", Pass("jtegen", "rowe7kuy")),
    ("COUNT TOPIC /news", Count("TOPIC", P("/news"))),
    ("COUNT MESSAGE /stock/quote/ibm", Count("MESSAGE", P("/stock/quote/ibm"))),
    ("COUNT SUB /stock/quote/ibm", Count("SUBSCRIBERS", P("/stock/quote/ibm"))),
    ("LIST TOPIC /", ListTopic("/")),
    ("LIST MESSAGES /stocks/quotes/ibm", ListMessage(IBM)),
    ("CREATE TOPIC /stocks/quotes/ibm", CreateTopic(IBM)),
    (
        "CREATE TOPIC /stocks/quotes/ibm > /stocks/ibm/quote",
        CreateTopic(IBM, None, "/stocks/ibm/quote"),
    ),
    (
        "CREATE TOPIC /stocks/ibm (IBM,STOCKS,QUOTE,BIG BLUE)",
        CreateTopic("/stocks/ibm", ("IBM", "STOCKS", "QUOTE", "BIG BLUE")),
    ),
    (
        "CREATE TOPIC /stocks/ibm (BIG BLUE) > /stocks/quotes/ibm",
        CreateTopic("/stocks/ibm", ("BIG BLUE",), IBM),
    ),
    ("REMOVE TOPIC /stocks/quotes/ibm", RemoveTopic(IBM)),
    (
        "SET TOPIC NAME /stocks/quotes/ibm /stocks/ibm/quote",
        SetTopicName(IBM, "/stocks/ibm/quote"),
    ),
    ("SET LOGIN PASSWORD CLEAR/1.0", SetLogin("PASSWORD", "CLEAR/1.0")),
    ("SET LOGIN PASSWORD KABEROS/4.0", SetLogin("PASSWORD", "KABEROS/4.0")),
    ("SET LOGIN NAME Jayne Smith", SetLogin("NAME", "Jayne Smith")),
    ("FIND TOPIC /stocks", FindTopic(P("/stocks"))),
    ("FIND TOPIC /stocks (BLUE)", FindTopic(P("/stocks"), ("BLUE",))),
    ("FIND TOPICS /stocks/* (BLUE)", FindTopic(P("/stocks", True), ("BLUE",))),
    ("REPUB MESS /stocks/quotes/ibm 1809", Republish(IBM, 1809)),
    ("SUB MESSAGE /stocks/quotes/ibm", Subscribe("MESSAGE", P(IBM))),
    ("SUBSCRIBE MESSAGE /stocks/quotes/*", Subscribe("MESSAGE", P("/stocks/quotes", True))),
    ("SUB MESSAGE /*", Subscribe("MESSAGE", P("/", True))),
    ("SUBSCRIBE TOPIC /stocks/quotes/ibm", Subscribe("TOPIC", P(IBM))),
    ("SUB TOPIC /stocks/quotes/*", Subscribe("TOPIC", P("/stocks/quotes", True))),
    ("SUB SUB /stocks/quotes/ibm", Subscribe("SUBSCRIBERS", P(IBM))),
    ("SUBSCRIBE SERVER TIMEOUT", Subscribe("SERVER", None)),
    ("UNSUB MESSAGE /stocks/quotes/ibm", Unsubscribe("MESSAGE", P(IBM))),
    ("UNSUB MESSAGE *", Unsubscribe("MESSAGE", P("", True))),
    ("UNSUB MESSAGE /stocks/*", Unsubscribe("MESSAGE", P("/stocks", True))),
    ("UNSUB TOPIC /stocks/quotes/ibm", Unsubscribe("TOPIC", P(IBM))),
    ("UNSUB TOPIC /stocks/quotes/*", Unsubscribe("TOPIC", P("/stocks/quotes", True))),
    ("UNSUB TOPIC *", Unsubscribe("TOPIC", P("", True))),
    ("UNSUB SUB /stocks/quotes/ibm", Unsubscribe("SUBSCRIBERS", P(IBM))),
    ("UNSUB *", Unsubscribe("*", P("", True))),
    ("GET MESSAGE /stocks/quotes/ibm 1865", GetMessage(IBM, SmuidSet(((1865, 1865),)))),
    (
        "GET MESSAGE /stocks/quotes/sony 2007",
        GetMessage("/stocks/quotes/sony", SmuidSet(((2007, 2007),))),
    ),
    ("GET MESSAGE /stocks/quotes/ibm 1865-2340", GetMessage(IBM, SmuidSet(((1865, 2340),)))),
    (
        "GET MESSAGE /stocks/quotes/ibm 1845-1890,1905,1920-1930",
        GetMessage(IBM, SmuidSet(((1845, 1890), (1905, 1905), (1920, 1930)))),
    ),
    ("GET MESSAGE /stocks/quotes/ibm *", GetMessage(IBM, SmuidSet(all=True))),
    ("GET TOPIC KEYWORDS /stocks/quotes/ibm", GetTopicKeywords(IBM)),
    ("NOOP", Noop()),
    ("QUIT", Quit()),
    ("310 ACK", Ack()),
]


@pytest.mark.parametrize(("line", "expected"), DRAFT_EXAMPLES, ids=[x[0] for x in DRAFT_EXAMPLES])
def test_draft_examples(line: str, expected: object) -> None:
    assert parse_command_line(line) == expected


@pytest.mark.parametrize(("line", "expected"), DRAFT_EXAMPLES, ids=[x[0] for x in DRAFT_EXAMPLES])
def test_serialize_round_trip_of_draft_examples(line: str, expected: object) -> None:
    wire = serialize_command(expected)  # type: ignore[arg-type]
    assert wire.endswith(b"\r\n") and wire.count(b"\n") == 1
    assert parse_command_line(wire[:-2].decode()) == expected


# Every abbreviation of profile section 3, and case-insensitivity of command words.
ABBREVIATIONS = [
    ("password jtegen secret", Pass("jtegen", "secret")),
    ("login jtegen clear/1.0", Login("jtegen", "CLEAR", "1.0")),
    ("LOGIN jtegen CLEAR", Login("jtegen", "CLEAR", "")),
    ("count topics /news", Count("TOPIC", P("/news"))),
    ("COUNT MESS /a", Count("MESSAGE", P("/a"))),
    ("COUNT MESSAGES /a/*", Count("MESSAGE", P("/a", True))),
    ("COUNT SUBSCRIBERS /a", Count("SUBSCRIBERS", P("/a"))),
    ("COUNT SUBSCRIBER /a", Count("SUBSCRIBERS", P("/a"))),
    ("COUNT TOPIC /", Count("TOPIC", P("/"))),
    ("LIST TOPICS /a", ListTopic("/a")),
    ("LIST MESS /a", ListMessage("/a")),
    ("LIST MESSAGE /a", ListMessage("/a")),
    ("REM TOPIC /a", RemoveTopic("/a")),
    ("REMOVE MESSAGE /a 7", RemoveMessage("/a", SmuidSet(((7, 7),)))),
    ("REM MESS /a 1-3, 9", RemoveMessage("/a", SmuidSet(((1, 3), (9, 9))))),
    ("rem topic /a", RemoveTopic("/a")),
    ("SET TOPIC KEYWORD /a (x,y)", SetTopicKeywords("/a", ("x", "y"))),
    ("SET TOPIC KEYWORDS /a (x)", SetTopicKeywords("/a", ("x",))),
    ("SET TOPIC KEY /a ()", SetTopicKeywords("/a", ())),
    ("SET LOGIN PASS clear/1.0", SetLogin("PASSWORD", "CLEAR/1.0")),
    ("SET LOGIN EMAIL jayne@example.com", SetLogin("EMAIL", "jayne@example.com")),
    ("SET LOGIN ADDRESS 1 Main St, Springfield", SetLogin("ADDRESS", "1 Main St, Springfield")),
    ("SET LOGIN PHONE +1 555 0100  ", SetLogin("PHONE", "+1 555 0100")),
    ("SET NOTIFY PORT 721", SetNotifyPort(721)),
    ("SET NOTIFY SUSPEND", SetNotifySuspend()),
    ("SET NOTIFY SUS", SetNotifySuspend()),
    ("SET NOTIFY RESUME", SetNotifyResume()),
    ("set notify res", SetNotifyResume()),
    # Profile §9.7: the delivery window, and an ACK naming its message.
    ("SET NOTIFY WINDOW 64", SetNotifyWindow(64)),
    ("set notify window  1 ", SetNotifyWindow(1)),
    ("310 ACK 1809", Ack(1809)),
    ("310 ack   1809 ", Ack(1809)),
    ("PUBLISH MESSAGE /a A1", PublishStart("MESSAGE", "/a", "A1")),
    ("PUB MESS /a A1", PublishStart("MESSAGE", "/a", "A1")),
    ("PUB MESSAGES /a A1", PublishStart("MESSAGE", "/a", "A1")),
    ("PUB REPLY /a CF0456", PublishStart("REPLY", "/a", "CF0456")),
    ("REPUBLISH MESSAGE /a 7", Republish("/a", 7)),
    ("REPUB MESSAGE /a 7", Republish("/a", 7)),
    ("SUBSCRIBE MESS /a", Subscribe("MESSAGE", P("/a"))),
    ("SUB SUBSCRIBERS /a", Subscribe("SUBSCRIBERS", P("/a"))),
    ("SUB SUBSCRIBER /a/*", Subscribe("SUBSCRIBERS", P("/a", True))),
    ("SUB SERV TIMEOUT", Subscribe("SERVER", None)),
    ("sub server timeout", Subscribe("SERVER", None)),
    (
        "SUB MESSAGE /a D08152001T08341245Z",
        Subscribe("MESSAGE", P("/a"), datetime(2001, 8, 15, 8, 34, 12, 450000, tzinfo=UTC)),
    ),
    ("UNSUBSCRIBE MESSAGE /a", Unsubscribe("MESSAGE", P("/a"))),
    ("UNSUB MESS *", Unsubscribe("MESSAGE", P("", True))),
    ("UNSUB SUB *", Unsubscribe("SUBSCRIBERS", P("", True))),
    ("UNSUB SERVER TIMEOUT", Unsubscribe("SERVER", None)),
    ("UNSUB SERV timeout", Unsubscribe("SERVER", None)),
    ("GET MESS /a 1", GetMessage("/a", SmuidSet(((1, 1),)))),
    ("GET TOPIC KEY /a", GetTopicKeywords("/a")),
    ("GET TOPIC KEYWORD /a", GetTopicKeywords("/a")),
    ("noop", Noop()),
    ("Quit", Quit()),
    ("310 ack", Ack()),
    # 1*SP: several spaces anywhere between words; leading and trailing spaces.
    ("SUB    SUB   /stocks/quotes/ibm  ", Subscribe("SUBSCRIBERS", P(IBM))),
    ("  NOOP  ", Noop()),
    ("PASS  jtegen  two words ", Pass("jtegen", "two words ")),
    ("CREATE TOPIC /a(x) > /b".replace("/a(", "/a ("), CreateTopic("/a", ("x",), "/b")),
    ("CREATE TOPIC /a (x)>/b", CreateTopic("/a", ("x",), "/b")),
    ("CREATE TOPIC /a ()", CreateTopic("/a", ())),
    ("FIND TOPIC /a ()", FindTopic(P("/a"), ())),
    ("FIND TOPIC /* (x)", FindTopic(P("/", True), ("x",))),
    ("GET MESSAGE /a 1, 3-4", GetMessage("/a", SmuidSet(((1, 1), (3, 4))))),
    ("PASS jtegen old new", Pass("jtegen", "old new")),
]


@pytest.mark.parametrize(("line", "expected"), ABBREVIATIONS, ids=[x[0] for x in ABBREVIATIONS])
def test_abbreviations_and_spacing(line: str, expected: object) -> None:
    assert parse_command_line(line) == expected


BAD_LINES = [
    ("HELO there", "unknown command"),
    ("", "unknown command"),
    ("NOTIFY MESSAGE /a", "unknown command"),
    ("PUBL MESSAGE /a A1", "unknown command"),
    ("SUBS MESSAGE /a", "unknown command"),
    ("NOOP now", "unexpected argument"),
    ("QUIT 1", "unexpected argument"),
    ("LOGIN", "missing argument"),
    ("LOGIN jtegen", "missing argument"),
    ("LOGIN jtegen /1.0", "invalid authentication method"),
    ("LOGIN jtegen CLEAR/1.0 extra", "unexpected argument"),
    ("PASS", "missing argument"),
    ("PASS jtegen", "missing argument"),
    ("PASS jtegen ", "missing argument"),
    ("COUNT", "missing argument"),
    ("COUNT FOO /a", "unknown resource"),
    ("COUNT SERVER /a", "unknown resource"),
    ("COUNT TOPIC", "missing argument"),
    ("COUNT TOPIC a", "invalid topic"),
    ("COUNT MESSAGE /", "invalid topic"),
    ("COUNT TOPIC /a /b", "unexpected argument"),
    ("LIST TOPIC /a/", "invalid topic"),
    ("LIST MESSAGE /", "invalid topic"),
    ("LIST MESSAGE /a/*", "invalid topic"),
    ("LIST SUB /a", "unknown resource"),
    ("CREATE MESSAGE /a", "unknown resource"),
    ("CREATE TOPIC", "missing argument"),
    ("CREATE TOPIC /1a", "invalid topic"),
    ("CREATE TOPIC /a (x", "invalid keywords"),
    ("CREATE TOPIC /a (x/y)", "invalid keyword"),
    ("CREATE TOPIC /a > ", "missing argument"),
    ("CREATE TOPIC /a > b", "invalid topic"),
    ("CREATE TOPIC /a > /b /c", "unexpected argument"),
    ("CREATE TOPIC /a x", "unexpected argument"),
    ("CREATE TOPIC /a > /b (x)", "unexpected argument"),
    ("REMOVE TOPIC", "missing argument"),
    ("REMOVE TOPIC /a/*", "invalid topic"),
    ("SET", "missing argument"),
    ("SET TOPIC", "missing argument"),
    ("SET FOO BAR", "unknown resource"),
    ("SET TOPIC COLOR /a", "unknown topic attribute"),
    ("SET TOPIC NAME /a", "missing argument"),
    ("SET TOPIC NAME /a b", "invalid topic"),
    ("SET TOPIC KEYWORDS /a", "missing argument"),
    ("SET TOPIC KEYWORDS /a x,y", "invalid keywords"),
    ("SET LOGIN SHOE 42", "unknown login attribute"),
    ("SET LOGIN NAME", "missing argument"),
    ("SET LOGIN NAME   ", "missing argument"),
    ("SET LOGIN PASSWORD", "missing argument"),
    ("SET NOTIFY PORT", "missing argument"),
    ("SET NOTIFY PORT 0", "invalid port"),
    ("SET NOTIFY PORT 65536", "invalid port"),
    ("SET NOTIFY PORT x", "invalid port"),
    ("SET NOTIFY SUSPEND now", "unexpected argument"),
    ("SET NOTIFY LOUDER", "unknown notify attribute"),
    ("SET NOTIFY WINDOW", "missing argument"),
    ("SET NOTIFY WINDOW 0", "invalid window"),
    ("SET NOTIFY WINDOW -3", "invalid window"),
    ("SET NOTIFY WINDOW many", "invalid window"),
    ("SET NOTIFY WINDOW 4 8", "unexpected argument"),
    ("310 ACK 0", "invalid smuid"),
    ("310 ACK host/1809", "invalid smuid"),
    ("310 ACK 1809 1810", "unexpected argument"),
    ("FIND TOPIC", "missing argument"),
    ("FIND TOPIC /a BLUE", "unexpected argument"),
    ("FIND TOPIC *", "invalid topic"),
    ("PUB", "missing argument"),
    ("PUB TOPIC /a A1", "unknown resource"),
    ("PUB MESSAGE /a", "missing argument"),
    ("PUB MESSAGE /a/* A1", "invalid topic"),
    ("PUB MESSAGE /a A1 A2", "unexpected argument"),
    ("REPUB MESSAGE /a", "missing argument"),
    ("REMOVE MESSAGE /a", "missing argument"),
    ("REMOVE MESSAGE /a x", "invalid smuid list"),
    ("REMOVE MESSAGE /a/* 1", "invalid topic"),
    ("REPUB MESSAGE /a 0", "invalid smuid"),
    ("REPUB MESSAGE /a x", "invalid smuid"),
    ("REPUB TOPIC /a 1", "unknown resource"),
    ("SUB", "missing argument"),
    ("SUB FOO /a", "unknown resource"),
    ("SUB MESSAGE", "missing argument"),
    ("SUB MESSAGE *", "invalid topic"),
    ("SUB MESSAGE /a yesterday", "invalid date-time"),
    ("SUB MESSAGE /a D08152001T08341245Z x", "unexpected argument"),
    ("SUB TOPIC /a D08152001T08341245Z", "unexpected argument"),
    ("SUB SERVER", "missing argument"),
    ("SUB SERVER BYE", "unknown server attribute"),
    ("UNSUB", "missing argument"),
    ("UNSUB * /a", "unexpected argument"),
    ("UNSUB FOO /a", "unknown resource"),
    ("UNSUB MESSAGE", "missing argument"),
    ("UNSUB SERVER BYE", "unknown server attribute"),
    ("GET MESSAGE /a", "missing argument"),
    ("GET MESSAGE /a 0", "invalid smuid list"),
    ("GET MESSAGE /a 3-1", "invalid smuid list"),
    ("GET TOPIC NAME /a", "unknown topic attribute"),
    ("GET TOPIC KEYWORDS", "missing argument"),
    ("GET SUB /a", "unknown resource"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES, ids=[x[0] for x in BAD_LINES])
def test_bad_command_lines(line: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_command_line(line)
    assert info.value.code == 400
    assert info.value.text == f"Bad request ({reason})"
    assert str(info.value) == f"400 Bad request ({reason})"


def test_command_names_for_dispatch() -> None:
    assert Login.name == "LOGIN"
    assert ListTopic.name == "LIST TOPIC"
    assert GetMessage.name == "GET MESSAGE"
    assert Publish.name == "PUBLISH"
    assert Ack.name == "ACK"
    assert parse_command_line("SUB SUB /a").name == "SUBSCRIBE"


def test_is_publish_line() -> None:
    assert is_publish_line(b"PUB MESSAGE /a A1")
    assert is_publish_line(b"  publish junk")
    assert is_publish_line(b"pub")
    assert not is_publish_line(b"PUBX MESSAGE")
    assert not is_publish_line(b"REPUB MESSAGE /a 1")


def test_serialize_publish_includes_message() -> None:
    msg = Message(
        [("Priority", "1"), ("Created", "D08152001T08341245Z")],
        [DataSection([("Content-Type", "text/plain")], b"24.567")],
    )
    wire = serialize_command(Publish("MESSAGE", IBM, "A004", msg))
    assert wire == (
        b"PUBLISH MESSAGE /stocks/quotes/ibm A004\r\n"
        b"Priority: 1\r\nCreated: D08152001T08341245Z\r\n\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n24.567\r\n.\r\n"
    )


def test_serialize_refuses_line_breaks() -> None:
    with pytest.raises(ValueError):
        serialize_command(Pass("jtegen", "a\r\nQUIT"))
    with pytest.raises(ValueError):
        serialize_command(RawLine("x\ny"))
    with pytest.raises(ValueError):
        serialize_command(Publish("MESSAGE", "/a", "A1", Message([("X-A", "v\r\nX-B: w")], [])))


def test_serialize_canonical_forms() -> None:
    assert serialize_command(Login("u", "CLEAR", "")) == b"LOGIN u CLEAR\r\n"
    assert serialize_command(Unsubscribe("*", P("", True))) == b"UNSUBSCRIBE *\r\n"
    assert serialize_command(Subscribe("SERVER", None)) == b"SUBSCRIBE SERVER TIMEOUT\r\n"
    assert serialize_command(Ack()) == b"310 ACK\r\n"
    assert serialize_command(Ack(1809)) == b"310 ACK 1809\r\n"
    assert serialize_command(SetNotifyWindow(64)) == b"SET NOTIFY WINDOW 64\r\n"
    assert serialize_command(RawLine("biws")) == b"biws\r\n"
    assert serialize_command(CreateTopic("/a", ("B C",), "/d")) == b"CREATE TOPIC /a (B C) > /d\r\n"
