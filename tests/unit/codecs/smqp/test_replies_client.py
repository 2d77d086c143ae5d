"""Replies, greeting, notifications and GET MESSAGE blocks: what the server writes, and how
ClientConnection reads it back."""

from __future__ import annotations

import pytest

from broker.smqp.client import (
    CLOSED,
    NEED_DATA,
    Challenge,
    ClientConnection,
    Greeting,
    NotifyMessage,
    NotifyServer,
    NotifySub,
    NotifyTopic,
    ServerAck,
)
from broker.smqp.commands import Ack, Noop
from broker.smqp.errors import ProtocolError
from broker.smqp.message import DataSection, Message, serialize_message
from broker.smqp.replies import (
    Reply,
    error,
    ok,
    serialize_ack,
    serialize_get_reply,
    serialize_greeting,
    serialize_not_available,
    serialize_notify_message,
    serialize_notify_server_bye,
    serialize_notify_server_timeout,
    serialize_notify_sub,
    serialize_notify_topic,
    serialize_reply,
)

IBM = "/stocks/quotes/ibm"


def client_events(data: bytes, *, greeting: bool = False) -> list[object]:
    conn = ClientConnection(expect_greeting=greeting)
    conn.receive_data(data)
    out: list[object] = []
    while (ev := conn.next_event()) is not NEED_DATA:
        out.append(ev)
    return out


def crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


# ------------------------------------------------------------------------------- replies


def test_single_and_multi_line_replies() -> None:
    assert serialize_reply(200, ["OK"]) == b"200 OK\r\n"
    assert serialize_reply(200, "OK") == b"200 OK\r\n"
    assert serialize_reply(200, ["OK", "A004 1809"]) == b"200-OK\r\n200 A004 1809\r\n"
    login = serialize_reply(
        200,
        [
            "OK",
            "Topic: /accounts/jtegen",
            "Timeout: 00:24:00:00",
            "Time: D08232001T14451246Z",
            "Guid: jtegen0456",
        ],
    )
    assert login == crlf(
        "200-OK\n200-Topic: /accounts/jtegen\n200-Timeout: 00:24:00:00\n"
        "200-Time: D08232001T14451246Z\n200 Guid: jtegen0456\n"
    )
    assert ok() == b"200 OK\r\n"
    assert error(ProtocolError(400, "Bad request (line too long)")) == (
        b"400 Bad request (line too long)\r\n"
    )
    assert error(ProtocolError(414, "Resource too large")) == b"414 Resource too large\r\n"
    assert serialize_ack() == b"310 ACK\r\n"
    assert Reply(200, ["OK", "2"]).serialize() == b"200-OK\r\n200 2\r\n"


@pytest.mark.parametrize(
    ("code", "lines"), [(99, ["x"]), (1000, ["x"]), (200, []), (200, ["a\r\nb"]), (200, ["a\n"])]
)
def test_serialize_reply_refuses_bad_input(code: int, lines: list[str]) -> None:
    with pytest.raises(ValueError):
        serialize_reply(code, lines)


def test_client_parses_replies() -> None:
    data = crlf(
        "200 OK\n200-OK\n200-Topic: /accounts/jtegen\n200 Guid: jtegen0456\n"
        "400 Bad request (unknown command)\n200\n510 Maximum quantity exceeded\n"
        "200-OK\n200 + AmFYig==\n310 ACK\n"
    )
    assert client_events(data) == [
        Reply(200, ["OK"]),
        Reply(200, ["OK", "Topic: /accounts/jtegen", "Guid: jtegen0456"]),
        Reply(400, ["Bad request (unknown command)"]),
        Reply(200, [""]),
        Reply(510, ["Maximum quantity exceeded"]),
        Reply(200, ["OK", "+ AmFYig=="]),
        ServerAck(),
    ]


# ------------------------------------------------------------------------------ greeting


def test_greeting() -> None:
    assert serialize_greeting("OmicronSoft SMQP Server/1.0 (c) 2001") == (
        b"SMQP/1.0 Ready. OmicronSoft SMQP Server/1.0 (c) 2001\r\n"
    )
    assert serialize_greeting("") == b"SMQP/1.0 Ready.\r\n"
    assert serialize_not_available() == b"SMQP/1.0 Not Available.\r\n"
    data = serialize_greeting("OmicronSoft SMQP Server/1.0 (c) 2001") + b"200 OK\r\n"
    assert client_events(data, greeting=True) == [
        Greeting("1.0", True, "OmicronSoft SMQP Server/1.0 (c) 2001"),
        Reply(200, ["OK"]),
    ]
    assert client_events(serialize_not_available(), greeting=True) == [Greeting("1.0", False, "")]
    assert client_events(b"SMQP/1.0\r\n", greeting=True) == [Greeting("1.0", True, "")]


@pytest.mark.parametrize(
    "line", [b"HTTP/1.1 200 OK\r\n", b"SMQP/x Ready.\r\n", b"SMQP/1.0 Busy\r\n"]
)
def test_bad_greeting(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        client_events(line, greeting=True)


# ------------------------------------------------------------------------- notifications

NOTIFIED = Message(
    [
        ("Priority", "1"),
        ("Created", "D08152001T08032445Z"),
        ("Receipt", "yes"),
        ("Reply", "NO"),
        ("Timeout", "00:01:00"),
        ("Depth", "1"),
        ("Sequence", "34"),
    ],
    [DataSection([("Content-Type", "text/plain")], b"34.456")],
)


def test_notify_message_matches_the_draft_example() -> None:
    wire = serialize_notify_message(IBM, "www.host.com/1835", "jtegen/jtegen3454654/A004", NOTIFIED)
    assert wire == crlf(
        "NOTIFY MESSAGE /stocks/quotes/ibm\n"
        "Created: D08152001T08032445Z\n"
        "Smuid: www.host.com/1835\n"
        "Cmuid: jtegen/jtegen3454654/A004\n"
        "Priority: 1\n"
        "Receipt: yes\n"
        "Reply: NO\n"
        "Timeout: 00:01:00\n"
        "Depth: 1\n"
        "Sequence: 34\n"
        "\n"
        "Content-Type: text/plain\n"
        "Content-Length: 6\n"
        "\n"
        "34.456\n"
        ".\n"
    )
    (ev,) = client_events(wire + b"310 ACK\r\n")[:1]
    assert isinstance(ev, NotifyMessage)
    assert ev.topic == IBM
    assert ev.message.get("Smuid") == "www.host.com/1835"
    assert ev.message.get("Cmuid") == "jtegen/jtegen3454654/A004"
    assert ev.message.headers[:3] == [
        ("Created", "D08152001T08032445Z"),
        ("Smuid", "www.host.com/1835"),
        ("Cmuid", "jtegen/jtegen3454654/A004"),
    ]
    assert ev.message.sections == NOTIFIED.sections
    assert client_events(wire + b"310 ACK\r\n")[1] == ServerAck()


def test_notify_message_replaces_stored_ids() -> None:
    stored = Message([("Smuid", "h/1"), ("Cmuid", "a/b/c"), ("X-A", "1")], [])
    wire = serialize_notify_message("/accounts/jtegen", "h/2", "x/y/CF0456", stored)
    assert wire == crlf(
        "NOTIFY MESSAGE /accounts/jtegen\nSmuid: h/2\nCmuid: x/y/CF0456\nX-A: 1\n\n.\n"
    )


def test_draft_notify_message_abbreviated_and_upper_case_headers() -> None:
    data = crlf(
        "NOTIFY MESS /stocks/quotes/ibm\nCreated: D08152001T08032445Z\nSMUID: host.com/1835\n"
        "CMUID: jtegen/jtegen005/A004\n\nContent-Type: text/plain\nContent-Length: 6\n\n"
        "34.456\n.\n"
    )
    (ev,) = client_events(data)
    assert isinstance(ev, NotifyMessage)
    assert ev.message.headers[1:] == [
        ("Smuid", "host.com/1835"),
        ("Cmuid", "jtegen/jtegen005/A004"),
    ]


def test_notify_topic_sub_server() -> None:
    assert serialize_notify_topic(IBM, "RENAME", "/stocks/quotes/big_blue") == crlf(
        "NOTIFY TOPIC /stocks/quotes/ibm\nAction: RENAME /stocks/quotes/big_blue\n\n"
    )
    assert serialize_notify_topic(IBM, "add") == crlf(
        "NOTIFY TOPIC /stocks/quotes/ibm\nAction: ADDED\n\n"
    )
    assert serialize_notify_topic(IBM, "KEYWORDS", ["IBM", "BIG BLUE"]) == crlf(
        "NOTIFY TOPIC /stocks/quotes/ibm\nAction: KEYWORDS IBM,BIG BLUE\n\n"
    )
    assert serialize_notify_sub(IBM, 34) == crlf("NOTIFY SUB /stocks/quotes/ibm\nCount: 34\n\n")
    assert serialize_notify_server_timeout(60) == b"NOTIFY SERVER TIMEOUT 00:01:00\r\n\r\n"
    assert serialize_notify_server_bye(300) == b"NOTIFY SERVER BYE 00:05:00\r\n\r\n"
    assert serialize_notify_server_bye() == b"NOTIFY SERVER BYE\r\n\r\n"
    with pytest.raises(ValueError):
        serialize_notify_topic(IBM, "EXPLODED")


def test_client_parses_draft_notifications() -> None:
    # As printed in the draft: upper-case attribute names, NOTIFY BYE without SERVER.
    data = crlf(
        "NOTIFY TOPIC /stocks/quotes/ibm\nACTION: RENAME /stocks/quotes/big_blue\n\n"
        "NOTIFY SUB /stocks/quotes/ibm\nCOUNT: 34\n\n"
        "NOTIFY BYE 00:05:00\n\n"
        "NOTIFY BYE\n\n"
        "NOTIFY SERV TIMEOUT 00:24:00:00\n\n"
        "NOTIFY TOPIC /a\nAction: DEL\n\n"
        "NOTIFY TOPIC /a\nAction: KEY IBM,BIG BLUE\nX-Future: ignored\n\n"
        "NOTIFY SUBSCRIBERS /a\nCount: 0\n\n"
    )
    assert client_events(data) == [
        NotifyTopic(IBM, "RENAME", "/stocks/quotes/big_blue"),
        NotifySub(IBM, 34),
        NotifyServer("BYE", 300),
        NotifyServer("BYE", None),
        NotifyServer("TIMEOUT", 86400),
        NotifyTopic("/a", "DELETED", None),
        NotifyTopic("/a", "KEYWORDS", "IBM,BIG BLUE"),
        NotifySub("/a", 0),
    ]


def test_notifications_between_replies() -> None:
    data = (
        b"200-OK\r\n200 /stocks/quotes/ibm\r\n"
        + serialize_notify_sub(IBM, 2)
        + serialize_notify_message(IBM, "h/1", "a/b/c", NOTIFIED)
        + b"310 ACK\r\n200 OK\r\n"
    )
    evs = client_events(data)
    assert [type(e).__name__ for e in evs] == [
        "Reply",
        "NotifySub",
        "NotifyMessage",
        "ServerAck",
        "Reply",
    ]


# ------------------------------------------------------------------------------ GET reply


def test_get_reply_blocks() -> None:
    second = Message([("Created", "D08152001T08032445Z")], [])
    wire = serialize_get_reply(
        [
            (IBM, "host.com/1835", "jtegen/jtegen005/A004", NOTIFIED),
            (IBM, "host.com/1836", "j/g/B", second),
        ]
    )
    assert wire.startswith(
        crlf(
            "200-OK\nTopic: /stocks/quotes/ibm\nCreated: D08152001T08032445Z\n"
            "Smuid: host.com/1835\nCmuid: jtegen/jtegen005/A004\nPriority: 1\n"
        )
    )
    assert wire.endswith(b".\r\n200 2 messages\r\n")
    (reply,) = client_events(wire)
    assert isinstance(reply, Reply)
    assert reply.code == 200
    assert reply.lines == ["OK", "2 messages"]
    assert len(reply.messages) == 2
    first = reply.messages[0]
    assert first.get("Topic") == IBM
    assert first.get("Smuid") == "host.com/1835"
    assert first.sections[0].body == b"34.456"
    assert reply.messages[1].headers == [
        ("Topic", IBM),
        ("Created", "D08152001T08032445Z"),
        ("Smuid", "host.com/1836"),
        ("Cmuid", "j/g/B"),
    ]
    assert client_events(serialize_get_reply([])) == [Reply(200, ["OK", "0 messages"])]


# ----------------------------------------------------------------------- client failures


@pytest.mark.parametrize(
    "data",
    [
        b"HELLO\r\n",
        b"200-OK\r\n400 Bad\r\n",
        b"200-OK\r\n\r\n",
        b"NOTIFY WEATHER /a\r\n\r\n",
        b"NOTIFY TOPIC /a\r\nno colon\r\n",
        b"NOTIFY TOPIC /a\r\n\r\n",
        b"NOTIFY TOPIC /a\r\nAction: EXPLODED\r\n\r\n",
        b"NOTIFY SUB /a\r\n\r\n",
        b"NOTIFY SUB /a\r\nCount: many\r\n\r\n",
        b"NOTIFY SERVER TIMEOUT\r\n\r\n",
        b"NOTIFY SERVER TIMEOUT soon\r\n\r\n",
        b"NOTIFY TOPIC a\r\n",
        b"NOTIFY MESSAGE /a\r\n\r\nContent-Type: t\r\n\r\n",
        b"NOTIFY MESSAGE /a\r\n\r\nContent-Type: t\r\nContent-Length: 2\r\n\r\nabc\r\n",
        b"200 \xff\r\n",
    ],
)
def test_malformed_server_data_raises(data: bytes) -> None:
    conn = ClientConnection(expect_greeting=False)
    conn.receive_data(data)
    with pytest.raises(ProtocolError):
        while conn.next_event() is not NEED_DATA:
            pass
    with pytest.raises(ProtocolError):  # the connection stays broken
        conn.next_event()


def test_client_line_limit_and_message_limit() -> None:
    conn = ClientConnection(expect_greeting=False, max_line=10)
    conn.receive_data(b"200 " + b"x" * 20 + b"\r\n")
    with pytest.raises(ProtocolError):
        conn.next_event()
    conn = ClientConnection(expect_greeting=False, max_message=3)
    conn.receive_data(b"NOTIFY MESSAGE /a\r\n\r\nContent-Type: t\r\nContent-Length: 4\r\n\r\n")
    with pytest.raises(ProtocolError) as info:
        conn.next_event()
    assert info.value.code == 414


def test_client_eof() -> None:
    conn = ClientConnection(expect_greeting=False)
    conn.receive_data(b"200-OK\r\n")
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    assert conn.next_event() is CLOSED


def test_client_send() -> None:
    conn = ClientConnection()
    assert conn.send(Noop()) == b"NOOP\r\n"
    assert conn.send(Ack()) == b"310 ACK\r\n"


def test_serialize_message_zero_sections_and_prefix() -> None:
    assert serialize_message(Message()) == b"\r\n.\r\n"
    assert serialize_message(Message([("X-A", "1")]), prefix_headers=[("Topic", "/a")]) == (
        b"Topic: /a\r\nX-A: 1\r\n\r\n.\r\n"
    )
    section = DataSection(
        [("X-Part", "2"), ("Content-Type", "t"), ("Content-Length", "999")], b"ab"
    )
    assert serialize_message(Message([], [section])) == (
        b"\r\nContent-Type: t\r\nContent-Length: 2\r\nX-Part: 2\r\n\r\nab\r\n.\r\n"
    )
    assert section.content_type == "t" and section.content_length == 2
    assert section.get("content-length") == "2"


def test_message_get_with_abbreviated_names_either_side() -> None:
    msg = Message([("Pri", "2"), ("seq", "5"), ("X-A", "x")])
    assert msg.get("Priority") == "2"
    assert msg.get("PRI") == "2"
    assert msg.get("Sequence") == "5"
    assert msg.get("x-a") == "x"
    assert msg.get("Name") is None


def test_scram_challenge_lines() -> None:
    """Issue 36: the server's SCRAM steps (``+ <base64>``) between the login replies."""
    events = client_events(crlf("200 + \n+ cj1hYmM=\n+ dj1zaWc=\n200-OK\n200 Guid: bob1\n"))
    assert events[1:] == [Challenge("cj1hYmM="), Challenge("dj1zaWc="),
                          Reply(200, ["OK", "Guid: bob1"])]
    assert isinstance(events[0], Reply) and events[0].code == 200
