"""ServerConnection: framing of commands and PUB messages, error recovery, limits, EOF."""

from __future__ import annotations

import pytest

from broker.smqp.commands import (
    Ack,
    ListTopic,
    Noop,
    Pass,
    Publish,
    Quit,
    RawLine,
    Subscribe,
)
from broker.smqp.connection import CLOSED, NEED_DATA, ServerConnection
from broker.smqp.errors import ProtocolError
from broker.smqp.message import DataSection, Message
from broker.smqp.values import TopicPattern

IBM = "/stocks/quotes/ibm"


def events(conn: ServerConnection, data: bytes = b"", *, eof: bool = False) -> list[object]:
    """Feed data (and EOF) and drain every event up to NEED_DATA/CLOSED (not included)."""
    if data:
        conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    out: list[object] = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA or ev is CLOSED:
            return out
        out.append(ev)


def feed(data: bytes, **kwargs: int) -> list[object]:
    return events(ServerConnection(**kwargs), data)


def bad(reason: str) -> ProtocolError:
    return ProtocolError(400, f"Bad request ({reason})")


def crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


# The draft's first PUBLISH MESSAGE example (its Content-Length says 5 for the 6 bytes of
# "24.567"; the corrected length is used here, the literal one further down).
PUB_ONE = crlf(
    "PUB MESSAGE /stocks/quotes/ibm A004\n"
    "Priority: 1\n"
    "Created: D08152001T08341245Z\n"
    "Receipt: yes\n"
    "Name: Stock quote for IBM\n"
    "Reply: NO\n"
    "Timeout: 00:01:00\n"
    "Depth: 1\n"
    "Sequence: 34\n"
    "\n"
    "Content-Type: text/plain\n"
    "Content-Length: 6\n"
    "\n"
    "24.567\n"
    ".\n"
)
PUB_ONE_HEADERS = [
    ("Priority", "1"),
    ("Created", "D08152001T08341245Z"),
    ("Receipt", "yes"),
    ("Name", "Stock quote for IBM"),
    ("Reply", "NO"),
    ("Timeout", "00:01:00"),
    ("Depth", "1"),
    ("Sequence", "34"),
]

HTML = b"<html><body><b>IBM</b> 24.567 </body></html>\r\n.\r\n\n\n\n"
assert len(HTML) == 52


def test_draft_pub_message_one_section() -> None:
    (ev,) = feed(PUB_ONE)
    assert ev == Publish(
        "MESSAGE",
        IBM,
        "A004",
        Message(PUB_ONE_HEADERS, [DataSection([("Content-Type", "text/plain")], b"24.567")]),
    )
    assert isinstance(ev, Publish)
    section = ev.message.sections[0]
    assert section.content_type == "text/plain"
    assert section.content_length == 6
    assert ev.message.get("priority") == "1"
    assert ev.message.get("Pri") == "1"
    assert ev.message.get("SEQ") == "34"
    assert ev.message.get("X-None") is None


def test_draft_pub_message_two_sections() -> None:
    data = (
        crlf(
            "PUB MESS /stocks/quotes/ibm A005\n"
            "Priority: 1\n"
            "Name: IBM Quote\n"
            "Created: D08152001T08341245Z\n"
            "Receipt: yes\n"
            "Reply: NO\n"
            "Timeout: 00:01:00\n"
            "Depth: 1\n"
            "Sequence: 34\n"
            "\n"
            "Content-Type: text/plain\n"
            "Content-Length: 6\n"
            "\n"
            "24.567\n"
            "Content-Type: text/html\n"
            "Content-Length: 52\n"
            "\n"
        )
        + HTML
        + b"\r\n.\r\n"
    )
    (ev,) = feed(data)
    assert isinstance(ev, Publish)
    assert (ev.kind, ev.topic, ev.cmuid) == ("MESSAGE", IBM, "A005")
    assert [s.body for s in ev.message.sections] == [b"24.567", HTML]
    assert [s.content_type for s in ev.message.sections] == ["text/plain", "text/html"]
    assert ev.message.get("Name") == "IBM Quote"


def test_draft_pub_message_literal_wrong_length_is_a_400_and_recovers() -> None:
    data = PUB_ONE.replace(b"Content-Length: 6", b"Content-Length: 5") + b"NOOP\r\n"
    assert feed(data) == [bad("data not followed by CRLF"), Noop()]


def test_draft_pub_reply() -> None:
    data = crlf(
        "PUB REPLY /stocks/quotes/ibm CF0456\n"
        "Created: D08152001T08035341Z\n"
        "Smuid: www.host.com/1835\n"
        "Cmuid: jtegen/jtegen497549/A004\n"
        "Priority: 1\n"
        "Timeout: 00:01:00\n"
        "\n"
        "Content-Type: text/plain\n"
        "content-length: 9\n"
        "\n"
        "Thank you\n"
        ".\n"
    )
    (ev,) = feed(data)
    assert isinstance(ev, Publish)
    assert ev.kind == "REPLY" and ev.cmuid == "CF0456"
    assert ev.message.get("Smuid") == "www.host.com/1835"
    assert ev.message.get("cmuid") == "jtegen/jtegen497549/A004"
    assert ev.message.sections[0].body == b"Thank you"


def test_smuid_and_cmuid_only_in_pub_reply() -> None:
    data = crlf("PUB MESSAGE /a A1\nSmuid: host/1\n\n.\n")
    assert feed(data) == [bad("unknown attribute Smuid")]


def test_zero_section_message() -> None:
    data = crlf("PUB MESSAGE /a A1\nPriority: 2\n\n.\nNOOP\n")
    assert feed(data) == [Publish("MESSAGE", "/a", "A1", Message([("Priority", "2")], [])), Noop()]


def test_zero_header_zero_section_message() -> None:
    assert feed(b"PUB MESSAGE /a A1\r\n\r\n.\r\n") == [
        Publish("MESSAGE", "/a", "A1", Message([], []))
    ]


def test_binary_body_with_dot_lines_and_nul() -> None:
    body = b"\x00\xff\r\n.\r\n\n.\n\r\n\r\n.\r\nPUB MESSAGE /x y\r\n" + bytes(range(256))
    data = (
        b"PUB MESSAGE /a A1\r\n\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
        + b"\r\n.\r\nQUIT\r\n"
    )
    evs = feed(data)
    assert evs[1] == Quit()
    assert isinstance(evs[0], Publish)
    assert evs[0].message.sections[0].body == body
    # Byte by byte gives the same.
    conn = ServerConnection()
    out: list[object] = []
    for i in range(len(data)):
        out += events(conn, data[i : i + 1])
    assert out == evs


def test_lf_only_line_endings_and_empty_lines() -> None:
    data = (
        b"\n\nNOOP\n\r\n   \nPUB MESSAGE /a A1\nX-K: v\n\n"
        b"Content-Type: t\nContent-Length: 2\n\nab\n.\nQUIT\n"
    )
    assert feed(data) == [
        Noop(),
        Publish(
            "MESSAGE",
            "/a",
            "A1",
            Message([("X-K", "v")], [DataSection([("Content-Type", "t")], b"ab")]),
        ),
        Quit(),
    ]


def test_empty_body_and_extra_blank_line_between_sections() -> None:
    data = crlf(
        "PUB MESSAGE /a A1\n\nContent-Type: t\nContent-Length: 0\n\n\n\nContent-Type: u\n"
        "Content-Length: 1\n\nz\n.\n"
    )
    (ev,) = feed(data)
    assert isinstance(ev, Publish)
    assert [s.body for s in ev.message.sections] == [b"", b"z"]


def test_header_names_are_canonicalised() -> None:
    data = crlf(
        "PUB MESSAGE /a A1\npri: 3\nSEQ: 4\nmime-version: 1.0\nx-Custom:  spaced value \n\n"
        "CONTENT-TYPE: text/plain\nContent-Encoding: zip\nEncryption: PGP version=2.6.2\n"
        "X-Part: 1\nCONTENT-LENGTH: 1\n\nz\n.\n"
    )
    (ev,) = feed(data)
    assert isinstance(ev, Publish)
    assert ev.message.headers == [
        ("Priority", "3"),
        ("Sequence", "4"),
        ("MIME-Version", "1.0"),
        ("x-Custom", "spaced value"),
    ]
    assert ev.message.sections[0].headers == [
        ("Content-Type", "text/plain"),
        ("Content-Encoding", "zip"),
        ("Encryption", "PGP version=2.6.2"),
        ("X-Part", "1"),
    ]


def test_pipelined_commands() -> None:
    data = b"NOOP\r\n" + PUB_ONE + b"SUB SUB /stocks/quotes/ibm\r\n" + PUB_ONE + b"310 ACK\r\n"
    evs = feed(data)
    assert [type(e).__name__ for e in evs] == ["Noop", "Publish", "Subscribe", "Publish", "Ack"]
    assert evs[2] == Subscribe("SUBSCRIBERS", TopicPattern(IBM))
    assert evs[4] == Ack()


# ------------------------------------------------------------------------ message errors

MESSAGE_ERRORS = [
    ("Color: red\n\n", "unknown attribute Color"),
    ("Priority: 0\n\n", "invalid Priority"),
    ("Priority: high\n\n", "invalid Priority"),
    ("Priority: 1\nPri: 2\n\n", "duplicate attribute Priority"),
    ("Created: yesterday\n\n", "invalid date-time"),
    ("Receipt: maybe\n\n", "invalid boolean"),
    ("Reply: 1\n\n", "invalid boolean"),
    ("Timeout: soon\n\n", "invalid timeout"),
    ("Depth: -2\n\n", "invalid Depth"),
    ("Sequence: 0\n\n", "invalid Sequence"),
    ("MIME-Version: one\n\n", "invalid MIME-Version"),
    ("Name: " + "n" * 129 + "\n\n", "Name longer than 128 characters"),
    ("no colon here\n\n", "malformed header"),
    (": empty name\n\n", "malformed header"),
    ("Bad Name: x\n\n", "malformed header"),
    (" Folded: x\n\n", "malformed header"),
    ("\nContent-Type: t\n\nabc\n", "missing Content-Length"),
    ("\nContent-Type: t\nContent-Length: abc\n\nabc\n", "invalid Content-Length"),
    ("\nContent-Type: t\nContent-Length: -1\n\nabc\n", "invalid Content-Length"),
    ("\nContent-Type: t\nContent-Length: +3\n\nabc\n", "invalid Content-Length"),
    (
        "\nContent-Type: t\nContent-Length: 3\nContent-Length: 3\n\nabc\n",
        "duplicate Content-Length",
    ),
    ("\nContent-Length: 3\n\nabc\n", "missing Content-Type"),
    (
        "\nContent-Type: t\nContent-Type: u\nContent-Length: 3\n\nabc\n",
        "duplicate attribute Content-Type",
    ),
    (
        "\nContent-Type: t\nPriority: 1\nContent-Length: 3\n\nabc\n",
        "unknown data attribute Priority",
    ),
    ("\nContent-Type: t\nContent-Length: 3\n\nabcd\n", "data not followed by CRLF"),
    ("Priority: 1\n", "missing empty line after header"),
    ("\nContent-Type: t\n", "incomplete data section"),
]


@pytest.mark.parametrize(("body", "reason"), MESSAGE_ERRORS, ids=[x[1] for x in MESSAGE_ERRORS])
def test_message_errors_recover_at_the_dot(body: str, reason: str) -> None:
    data = crlf("PUB MESSAGE /a A1\n" + body + ".\nNOOP\n")
    assert feed(data) == [bad(reason), Noop()]
    # Same with LF only, and byte by byte.
    assert feed(data.replace(b"\r\n", b"\n")) == [bad(reason), Noop()]
    conn = ServerConnection()
    out: list[object] = []
    for i in range(len(data)):
        out += events(conn, data[i : i + 1])
    assert out == [bad(reason), Noop()]


def test_known_length_data_is_skipped_by_length_after_an_error() -> None:
    # The first header is bad; the section's data hold a "." line that must not end the
    # message, since its length is known.
    data = crlf(
        "PUB MESSAGE /a A1\nColor: red\n\nContent-Type: t\nContent-Length: 5\n\n.\n.\n\n.\nQUIT\n"
    )
    assert feed(data) == [bad("unknown attribute Color"), Quit()]


def test_first_error_wins() -> None:
    data = crlf("PUB MESSAGE /a A1\nColor: red\nno colon\n\n.\n")
    assert feed(data) == [bad("unknown attribute Color")]
    data = crlf("PUB MESSAGE /a A1\nno colon\nColor: red\n\n.\n")
    assert feed(data) == [bad("malformed header")]


def test_bad_pub_command_line_still_skips_its_message() -> None:
    data = crlf(
        "PUB MESSAGE /bad/1topic A1\nPriority: 1\n\nContent-Type: t\nContent-Length: 3\n\n"
        ".\n\n.\nNOOP\nPUB FOO\n\n.\nPUBLISH\n.\nQUIT\n"
    )
    assert feed(data) == [
        bad("invalid topic"),
        Noop(),
        bad("unknown resource"),
        bad("missing argument"),
        Quit(),
    ]


def test_invalid_utf8_and_control_characters() -> None:
    assert feed(b"NOOP \xff\r\nNOOP\r\n") == [bad("invalid UTF-8"), Noop()]
    assert feed(b"NO\x00OP\r\nNOOP\r\n") == [bad("control character"), Noop()]
    assert feed(b"NO\rOP\r\n") == [bad("control character")]
    assert feed(b"PASS u \xc3\xa9t\xc3\xa9\r\n") == [Pass("u", "\u00e9t\u00e9")]
    data = b"PUB MESSAGE /a A1\r\nX-A: \xff\r\n\r\n.\r\nNOOP\r\n"
    assert feed(data) == [bad("invalid UTF-8"), Noop()]
    data = b"PUB MESSAGE /a A1\r\nX-A: a\x01b\r\n\r\n.\r\n"
    assert feed(data) == [bad("control character")]
    # Non-ASCII header values are fine (slow path of the header block).
    data = "PUB MESSAGE /a A1\r\nName: caf\u00e9\r\nX-T:\ttab\r\n\r\n.\r\n".encode()
    (ev,) = feed(data)
    assert isinstance(ev, Publish)
    assert ev.message.headers == [("Name", "caf\u00e9"), ("X-T", "tab")]


def test_invalid_utf8_in_pub_line_skips_the_message() -> None:
    data = b"PUB MESSAGE /a\xff A1\r\nPriority: 1\r\n\r\n.\r\nNOOP\r\n"
    assert feed(data) == [bad("invalid UTF-8"), Noop()]


# ----------------------------------------------------------------------- line length


def test_line_at_the_limit_is_accepted_and_one_more_byte_is_not() -> None:
    ok_line = b"PASS u " + b"x" * (4096 - 7)
    assert len(ok_line) == 4096
    assert feed(ok_line + b"\r\n") == [Pass("u", "x" * 4089)]
    assert feed(ok_line + b"\n") == [Pass("u", "x" * 4089)]
    assert feed(ok_line + b"y\r\nNOOP\r\n") == [bad("line too long"), Noop()]


def test_line_too_long_recovery_in_small_limit() -> None:
    assert feed(b"NOOP" + b" " * 20 + b"\r\nNOOP\r\n", max_line=16) == [
        bad("line too long"),
        Noop(),
    ]


def test_too_long_pub_line_skips_its_message() -> None:
    # The data hold lines that look like commands: they must not be run.
    data = (
        b"PUB MESSAGE /" + b"a" * 5000 + b" A1\r\nPriority: 1\r\n\r\nContent-Type: t\r\n"
        b"Content-Length: 23\r\n\r\nREMOVE TOPIC /a\r\nQUIT\r\n\r\n.\r\nNOOP\r\n"
    )
    assert feed(data) == [bad("line too long"), Noop()]
    conn = ServerConnection()
    out: list[object] = []
    for i in range(0, len(data), 1000):
        out += events(conn, data[i : i + 1000])
    assert out == [bad("line too long"), Noop()]


def test_large_body_in_random_chunks() -> None:
    import random

    rng = random.Random(7)
    body = rng.randbytes(300_000)
    data = (
        b"PUB MESSAGE /a A1\r\n\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
        + b"\r\n.\r\nNOOP\r\n"
    )
    conn = ServerConnection()
    out: list[object] = []
    i = 0
    while i < len(data):
        n = rng.randint(1, 20000)
        out += events(conn, data[i : i + n])
        i += n
    assert len(out) == 2 and out[1] == Noop()
    assert isinstance(out[0], Publish) and out[0].message.sections[0].body == body
    assert conn.buffer_size < 64


def test_megabyte_line_in_4k_chunks_is_not_buffered() -> None:
    conn = ServerConnection()
    line = b"SUB MESSAGE /" + b"a" * (1024 * 1024)
    out: list[object] = []
    peak = 0
    for i in range(0, len(line), 4096):
        out += events(conn, line[i : i + 4096])
        peak = max(peak, conn.buffer_size)
    out += events(conn, b"\r\nLIST TOPIC /\r\n")
    assert out == [bad("line too long"), ListTopic("/")]
    assert peak <= 2 * 4096 + 2
    assert conn.buffer_size < 64


def test_megabyte_line_in_one_chunk_then_usable() -> None:
    conn = ServerConnection()
    assert events(conn, b"x" * (1024 * 1024) + b"\r\nNOOP\r\n") == [bad("line too long"), Noop()]


def test_megabyte_line_without_end_reported_once() -> None:
    conn = ServerConnection()
    out: list[object] = []
    for _ in range(256):
        out += events(conn, b"z" * 4096)
    assert out == [bad("line too long")]
    assert conn.buffer_size <= 4096
    assert events(conn, b"tail\nNOOP\n") == [Noop()]


def test_too_long_header_line_inside_a_message() -> None:
    data = b"PUB MESSAGE /a A1\r\nX-Big: " + b"v" * 5000 + b"\r\n\r\n.\r\nNOOP\r\n"
    assert feed(data) == [bad("line too long"), Noop()]
    conn = ServerConnection()
    out: list[object] = []
    for i in range(0, len(data), 1000):
        out += events(conn, data[i : i + 1000])
    assert out == [bad("line too long"), Noop()]


# ----------------------------------------------------------------------------- max sizes


def test_over_size_message_is_discarded_as_it_arrives() -> None:
    conn = ServerConnection(max_message=1000)
    body = b"\r\n.\r\n" * 2000  # 10,000 bytes, dots included
    head = (
        b"PUB MESSAGE /a A1\r\n\r\nContent-Type: t\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    out = events(conn, head)
    peak = 0
    for i in range(0, len(body), 512):
        out += events(conn, body[i : i + 512])
        peak = max(peak, conn.buffer_size)
    out += events(conn, b"\r\n.\r\nNOOP\r\n")
    assert out == [ProtocolError(414, "Resource too large"), Noop()]
    assert peak <= 1024


def test_total_of_sections_counts_for_max_message() -> None:
    def pub(*sizes: int) -> bytes:
        out = b"PUB MESSAGE /a A1\r\n\r\n"
        for n in sizes:
            out += f"Content-Type: t\r\nContent-Length: {n}\r\n\r\n".encode() + b"x" * n + b"\r\n"
        return out + b".\r\n"

    (ok,) = feed(pub(60, 40), max_message=100)
    assert isinstance(ok, Publish)
    assert feed(pub(60, 41) + b"NOOP\r\n", max_message=100) == [
        ProtocolError(414, "Resource too large"),
        Noop(),
    ]


def test_header_bytes_limit() -> None:
    headers = "".join(f"X-H{i}: {'v' * 50}\r\n" for i in range(100))
    data = f"PUB MESSAGE /a A1\r\n{headers}\r\n.\r\nNOOP\r\n".encode()
    assert feed(data, max_header_bytes=2000) == [ProtocolError(414, "Resource too large"), Noop()]
    (ev, noop) = feed(data)
    assert isinstance(ev, Publish) and len(ev.message.headers) == 100 and noop == Noop()


# ------------------------------------------------------------------------------------ EOF


def test_eof_mid_line_is_closed() -> None:
    conn = ServerConnection()
    assert events(conn, b"NOOP\r\nQUI", eof=True) == [Noop()]
    assert conn.next_event() is CLOSED
    assert conn.next_event() is CLOSED


def test_eof_mid_message_is_closed() -> None:
    for cut in range(1, len(PUB_ONE)):
        conn = ServerConnection()
        conn.receive_data(PUB_ONE[:cut])
        conn.receive_data(b"")
        assert conn.next_event() is CLOSED, cut


def test_eof_after_complete_input() -> None:
    conn = ServerConnection()
    conn.receive_data(b"NOOP\r\n")
    conn.receive_data(b"")
    assert conn.next_event() == Noop()
    assert conn.next_event() is CLOSED
    conn.receive_data(b"NOOP\r\n")  # ignored after EOF
    assert conn.next_event() is CLOSED


def test_eof_while_skipping_a_long_line() -> None:
    conn = ServerConnection(max_line=10)
    assert events(conn, b"x" * 100) == [bad("line too long")]
    conn.receive_data(b"")
    assert conn.next_event() is CLOSED


# -------------------------------------------------------------------------------- raw lines


def test_expect_raw_line() -> None:
    conn = ServerConnection()
    conn.expect_raw_line()
    assert events(conn, b"\r\nc=biws,r=abc NOOP\r\nNOOP\r\n") == [
        RawLine("c=biws,r=abc NOOP"),
        Noop(),
    ]


def test_expect_raw_line_waits_for_a_complete_line() -> None:
    conn = ServerConnection()
    conn.expect_raw_line()
    assert events(conn, b"QUI") == []
    assert events(conn, b"T\r\n") == [RawLine("QUIT")]
    assert events(conn, b"QUIT\r\n") == [Quit()]


def test_raw_line_errors_reset_the_mode() -> None:
    conn = ServerConnection(max_line=8)
    conn.expect_raw_line()
    assert events(conn, b"123456789\r\nNOOP\r\n") == [bad("line too long"), Noop()]
    conn.expect_raw_line()
    assert events(conn, b"\xff\r\nNOOP\r\n") == [bad("invalid UTF-8"), Noop()]


def test_next_event_before_any_data() -> None:
    conn = ServerConnection()
    assert conn.next_event() is NEED_DATA
    assert repr(NEED_DATA) == "NEED_DATA" and repr(CLOSED) == "CLOSED"
