"""Property tests: serialise -> parse is the identity for commands, messages, replies and
notifications; value formats round-trip; arbitrary bytes in any chunking never make the
parsers raise (ServerConnection: never at all; ClientConnection: only ProtocolError); and
the events of a stream do not depend on how it is split into chunks."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.smqp import commands as c
from broker.smqp.client import (
    CLOSED,
    NEED_DATA,
    ClientConnection,
    NotifyMessage,
    NotifyServer,
    NotifySub,
    NotifyTopic,
    ServerAck,
)
from broker.smqp.connection import ServerConnection
from broker.smqp.errors import ProtocolError
from broker.smqp.message import DataSection, Message
from broker.smqp.replies import (
    Reply,
    serialize_get_reply,
    serialize_notify_message,
    serialize_notify_server_bye,
    serialize_notify_server_timeout,
    serialize_notify_sub,
    serialize_notify_topic,
    serialize_reply,
)
from broker.smqp.values import (
    SmuidSet,
    TopicPattern,
    format_bool,
    format_datetime,
    format_smuid_ranges,
    format_timeout,
    parse_datetime,
    parse_smuid_list,
    parse_timeout,
)
from tests.support.examples import examples

# SMQP_HYPOTHESIS_SCALE=20 multiplies the example counts for a long soak run (examples()).
PROPS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FUZZ = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# ------------------------------------------------------------------------------ strategies

letters = st.characters(categories=("Lu", "Ll", "Lo"), max_codepoint=0x9FFF)
word_chars = st.one_of(letters, st.sampled_from("0123456789_"), st.characters(categories=("Nd",)))
segment = st.builds(lambda a, b: a + b, letters, st.text(word_chars, max_size=8))
ascii_segment = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True)
topics = st.lists(st.one_of(ascii_segment, segment), min_size=1, max_size=4).map(
    lambda segs: "/" + "/".join(segs)
)
patterns = st.one_of(
    topics.map(TopicPattern),
    topics.map(lambda t: TopicPattern(t, True)),
    st.just(TopicPattern("/", True)),
)
# Printable text without control characters (no line breaks), any Unicode.
line_text = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=30)
tokens = st.text(
    st.characters(exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=12
)
keyword = (
    st.from_regex(r"[A-Za-z0-9\u00e9\u00df][A-Za-z0-9 .\-\u00e9]{0,10}", fullmatch=True)
    .map(lambda s: s.strip(" "))
    .filter(bool)
)
keywords = st.lists(keyword, max_size=4).map(tuple)
datetimes = st.datetimes(
    min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=d.microsecond // 10000 * 10000))
smuid_sets = st.one_of(
    st.just(SmuidSet(all=True)),
    st.lists(
        st.tuples(st.integers(1, 10**12), st.integers(0, 1000)).map(lambda t: (t[0], t[0] + t[1])),
        min_size=1,
        max_size=5,
    ).map(lambda r: SmuidSet(tuple(r))),
)
header_values = line_text.map(lambda s: s.strip(" \t"))
x_names = st.from_regex(r"X-[A-Za-z0-9-]{1,10}", fullmatch=True)
bodies = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.one_of(
            st.sampled_from([b"\r\n", b".", b"\r\n.\r\n", b"\n.\n", b"\r", b"\n"]),
            st.binary(max_size=8),
        ),
        max_size=12,
    ).map(b"".join),
)


@st.composite
def publish_headers(draw: st.DrawFn, reply: bool = False) -> list[tuple[str, str]]:
    known = {
        "Name": st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=128).map(
            lambda s: s.strip(" \t")
        ),
        "Priority": st.integers(1, 10**6).map(str),
        "Created": datetimes.map(format_datetime),
        "Receipt": st.booleans().map(format_bool),
        "Reply": st.sampled_from(["YES", "NO", "yes", "No"]),
        "Timeout": st.integers(-5, 10**7).map(format_timeout),
        "Depth": st.integers(-1, 100).map(str),
        "Sequence": st.integers(1, 10**9).map(str),
        "MIME-Version": st.just("1.0"),
    }
    if reply:
        known["Smuid"] = st.integers(1, 10**9).map(lambda n: f"www.host.com/{n}")
        known["Cmuid"] = st.just("jtegen/jtegen497549/A004")
    names = draw(st.lists(st.sampled_from(sorted(known)), unique=True, max_size=5))
    headers = [(n, draw(known[n])) for n in names]
    headers += draw(st.lists(st.tuples(x_names, header_values), max_size=3))
    return draw(st.permutations(headers))


@st.composite
def sections(draw: st.DrawFn) -> DataSection:
    headers = [
        (
            "Content-Type",
            draw(st.sampled_from(["text/plain", "image/gif", 'text/plain; charset="ISO-8859-4"'])),
        )
    ]
    extra = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("Content-Encoding"), st.just("zip")),
                st.tuples(st.just("Encryption"), st.just("PGP version=2.6.2,encoding=ascii")),
                st.tuples(x_names, header_values),
            ),
            max_size=3,
            unique_by=lambda kv: kv[0] if not kv[0].startswith("X-") else kv,
        )
    )
    return DataSection(headers + extra, draw(bodies))


@st.composite
def messages(draw: st.DrawFn, reply: bool = False) -> Message:
    return Message(draw(publish_headers(reply)), draw(st.lists(sections(), max_size=4)))


@st.composite
def publishes(draw: st.DrawFn) -> c.Publish:
    kind = draw(st.sampled_from(["MESSAGE", "REPLY"]))
    return c.Publish(kind, draw(topics), draw(tokens), draw(messages(kind == "REPLY")))


def _method() -> st.SearchStrategy[str]:
    return st.from_regex(r"[A-Z][A-Z0-9-]{0,12}", fullmatch=True)


rest_of_line = line_text.map(lambda s: s.strip(" ")).filter(bool)
secrets = st.builds(lambda a, b: a + b, tokens, line_text)

simple_commands = st.one_of(
    st.builds(c.Login, tokens, _method(), st.sampled_from(["", "1.0", "4.0"])),
    st.builds(c.Pass, tokens, secrets),
    st.just(c.Noop()),
    st.just(c.Quit()),
    st.builds(c.Count, st.sampled_from(["MESSAGE", "SUBSCRIBERS"]), patterns),
    st.builds(c.Count, st.just("TOPIC"), st.one_of(patterns, st.just(TopicPattern("/")))),
    st.builds(c.ListTopic, st.one_of(topics, st.just("/"))),
    st.builds(c.ListMessage, topics),
    st.builds(c.CreateTopic, topics, st.none() | keywords, st.none() | topics),
    st.builds(c.RemoveTopic, topics),
    st.builds(c.SetTopicName, topics, topics),
    st.builds(c.SetTopicKeywords, topics, keywords),
    st.builds(
        c.SetLogin,
        st.just("PASSWORD"),
        st.builds(lambda m, v: f"{m}/{v}", _method(), st.sampled_from(["1.0", "2"])),
    ),
    st.builds(c.SetLogin, st.sampled_from(["NAME", "EMAIL", "ADDRESS", "PHONE"]), rest_of_line),
    st.builds(c.SetNotifyPort, st.integers(1, 65535)),
    st.just(c.SetNotifySuspend()),
    st.just(c.SetNotifyResume()),
    st.builds(c.SetNotifyWindow, st.integers(1, 2**63 - 1)),
    st.builds(c.FindTopic, patterns, st.none() | keywords),
    st.builds(c.Republish, topics, st.integers(1, 2**63 - 1)),
    st.builds(c.Subscribe, st.just("MESSAGE"), patterns, st.none() | datetimes),
    st.builds(c.Subscribe, st.sampled_from(["TOPIC", "SUBSCRIBERS"]), patterns),
    st.just(c.Subscribe("SERVER", None)),
    st.builds(
        c.Unsubscribe,
        st.sampled_from(["MESSAGE", "TOPIC", "SUBSCRIBERS"]),
        st.one_of(patterns, st.just(TopicPattern("", True))),
    ),
    st.just(c.Unsubscribe("*", TopicPattern("", True))),
    st.just(c.Unsubscribe("SERVER", None)),
    st.builds(c.GetMessage, topics, smuid_sets),
    st.builds(c.RemoveMessage, topics, smuid_sets),
    st.builds(c.GetTopicKeywords, topics),
    st.just(c.Ack()),
    st.builds(c.Ack, st.integers(1, 2**63 - 1)),
)
all_commands = st.one_of(simple_commands, publishes())


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(x, 0), len(data)) for x in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return [x for x in out if x]


def server_events(chunks: list[bytes], eof: bool = True, **kwargs: int) -> list[object]:
    conn = ServerConnection(**kwargs)
    out: list[object] = []
    for chunk in [*chunks, b""] if eof else chunks:
        conn.receive_data(chunk)
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA:
                break
            out.append(ev)
            if ev is CLOSED:
                return out
    return out


def client_events(chunks: list[bytes]) -> list[object]:
    conn = ClientConnection(expect_greeting=False)
    out: list[object] = []
    for chunk in [*chunks, b""]:
        conn.receive_data(chunk)
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA:
                break
            out.append(ev)
            if ev is CLOSED:
                return out
    return out


# --------------------------------------------------------------------------- round trips


@PROPS
@given(simple_commands)
def test_command_line_round_trip(cmd: c.Command) -> None:
    wire = c.serialize_command(cmd)
    assert wire.endswith(b"\r\n") and wire.count(b"\n") == 1
    assert c.parse_command_line(wire[:-2].decode()) == cmd


@PROPS
@given(st.lists(all_commands, min_size=1, max_size=6), st.data())
def test_command_stream_round_trip_in_any_chunking(
    cmds: list[c.Command], data: st.DataObject
) -> None:
    wire = b"".join(c.serialize_command(x) for x in cmds)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=20))
    assert server_events(split(wire, cuts)) == [*cmds, CLOSED]


@PROPS
@given(st.lists(all_commands, min_size=1, max_size=4))
def test_command_stream_byte_by_byte_and_lf_only(cmds: list[c.Command]) -> None:
    wire = b"".join(c.serialize_command(x) for x in cmds)
    assert server_events([wire[i : i + 1] for i in range(len(wire))]) == [*cmds, CLOSED]


def lf_wire(pub: c.Publish) -> bytes:
    """The publish framed with bare LF line endings everywhere (bodies untouched)."""
    out = [f"PUB {pub.kind} {pub.topic} {pub.cmuid}\n".encode()]
    out += [f"{k}: {v}\n".encode() for k, v in pub.message.headers]
    out.append(b"\n")
    for section in pub.message.sections:
        ctype, *others = section.headers
        out.append(f"{ctype[0]}: {ctype[1]}\nContent-Length: {len(section.body)}\n".encode())
        out += [f"{k}: {v}\n".encode() for k, v in others]
        out += [b"\n", section.body, b"\n"]
    out.append(b".\n")
    return b"".join(out)


@PROPS
@given(st.lists(publishes(), min_size=1, max_size=3), st.data())
def test_message_round_trip_with_lf_only(pubs: list[c.Publish], data: st.DataObject) -> None:
    wire = b"".join(lf_wire(p) for p in pubs)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=10))
    assert server_events(split(wire, cuts)) == [*pubs, CLOSED]


@PROPS
@given(st.integers(100, 999), st.lists(line_text, min_size=1, max_size=5))
def test_reply_round_trip(code: int, lines: list[str]) -> None:
    events = client_events([serialize_reply(code, lines)])
    if code == 310 and len(lines) == 1:
        assert events == [ServerAck(), CLOSED]
    else:
        assert events == [Reply(code, lines), CLOSED]


def _delivered(topic: str | None, smuid: str, cmuid: str, msg: Message) -> Message:
    created = [kv for kv in msg.headers if kv[0] == "Created"][:1]
    rest = [
        kv for kv in msg.headers if kv not in created and kv[0] not in ("Topic", "Smuid", "Cmuid")
    ]
    prefix = [("Topic", topic)] if topic is not None else []
    return Message(prefix + created + [("Smuid", smuid), ("Cmuid", cmuid)] + rest, msg.sections)


notifications = st.one_of(
    st.builds(
        lambda t, a: (serialize_notify_topic(t, a), NotifyTopic(t, a, None)),
        topics,
        st.sampled_from(["ADDED", "DELETED"]),
    ),
    st.builds(
        lambda t, n: (serialize_notify_topic(t, "RENAME", n), NotifyTopic(t, "RENAME", n)),
        topics,
        topics,
    ),
    st.builds(
        lambda t, k: (
            serialize_notify_topic(t, "KEYWORDS", k),
            NotifyTopic(t, "KEYWORDS", ",".join(k) or None),
        ),
        topics,
        keywords,
    ),
    st.builds(
        lambda t, n: (serialize_notify_sub(t, n), NotifySub(t, n)), topics, st.integers(0, 10**6)
    ),
    st.builds(
        lambda s: (serialize_notify_server_timeout(s), NotifyServer("TIMEOUT", max(s, -1))),
        st.integers(-3, 10**7),
    ),
    st.builds(
        lambda s: (
            serialize_notify_server_bye(s),
            NotifyServer("BYE", s if s is None else max(s, -1)),
        ),
        st.none() | st.integers(-1, 10**6),
    ),
    st.builds(
        lambda t, n, m: (
            serialize_notify_message(t, f"host/{n}", "a/g/A1", m),
            NotifyMessage(t, _delivered(None, f"host/{n}", "a/g/A1", m)),
        ),
        topics,
        st.integers(1, 10**9),
        messages(reply=True),
    ),
    st.builds(
        lambda code, lines: (serialize_reply(code, lines), Reply(code, lines)),
        st.sampled_from([200, 400, 404, 510]),
        st.lists(line_text, min_size=1, max_size=3),
    ),
    st.builds(
        lambda items: (
            serialize_get_reply(items),
            Reply(200, ["OK", f"{len(items)} messages"], [_delivered(*it) for it in items]),
        ),
        st.lists(st.tuples(topics, st.just("h/1"), st.just("a/b/c"), messages()), max_size=3),
    ),
    st.just((b"310 ACK\r\n", ServerAck())),
)


@PROPS
@given(st.lists(notifications, min_size=1, max_size=5), st.data())
def test_server_stream_round_trip_in_any_chunking(
    items: list[tuple[bytes, object]], data: st.DataObject
) -> None:
    wire = b"".join(w for w, _ in items)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=20))
    assert client_events(split(wire, cuts)) == [*(ev for _, ev in items), CLOSED]


# --------------------------------------------------------------------------- value formats


@PROPS
@given(datetimes)
def test_datetime_round_trip(dt: datetime) -> None:
    text = format_datetime(dt)
    assert parse_datetime(text) == dt
    assert parse_datetime(dt.isoformat()) == dt
    assert parse_datetime(text[:-1]) == dt  # without the Z


@PROPS
@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_datetime_format_truncates(dt: datetime) -> None:
    assert parse_datetime(format_datetime(dt)) == dt.replace(
        microsecond=dt.microsecond // 10000 * 10000
    )


@PROPS
@given(st.integers(-(10**9), 2**31 - 1))
def test_timeout_round_trip(seconds: int) -> None:
    text = format_timeout(seconds)
    assert parse_timeout(text) == (seconds if seconds >= 0 else -1)
    if seconds >= 86400:
        assert len(text.split(":")) == 4 and text.split(":")[1] != "00"


@PROPS
@given(st.sets(st.integers(1, 5000), max_size=50))
def test_smuid_ranges_round_trip(numbers: set[int]) -> None:
    text = format_smuid_ranges(numbers)
    if not numbers:
        assert text == ""
        return
    parsed = parse_smuid_list(text)
    assert {n for n in range(1, 5001) if n in parsed} == numbers
    assert str(parsed) == text


# ---------------------------------------------------------------------------------- fuzzing

FRAGMENTS = [
    b"PUB MESSAGE /a A1\r\n",
    b"PUB REPLY /a A1\n",
    b"PUB ",
    b"Priority: 1\r\n",
    b"Pri: x\r\n",
    b"X-A: v\r\n",
    b"Content-Type: t\r\n",
    b"Content-Length: 3\r\n",
    b"Content-Length: 99999999\r\n",
    b"Content-Length: x\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b".\r\n",
    b".",
    b"abc",
    b"NOOP\r\n",
    b"310 ACK\r\n",
    b"SUB SUB /a/*\r\n",
    b"NOTIFY MESSAGE /a\r\n",
    b"NOTIFY TOPIC /a\r\nAction: ADD\r\n",
    b"NOTIFY SUB /a\r\n",
    b"Count: 3\r\n",
    b"NOTIFY SERVER BYE\r\n",
    b"200-OK\r\n",
    b"200 OK\r\n",
    b"Topic: /a\r\n",
    b"SMQP/1.0 Ready. x\r\n",
    b"\xff\xfe",
    b"\x00",
    b"x" * 40,
    b"SUB MESSAGE /a 2001-08-23T14:45:12+99:99\r\n",
    b"SUB MESSAGE /a 0001-01-01T00:00:00+01:00\r\n",
    b"SUB MESSAGE /a D00000000T000000Z\r\n",
    b"GET MESSAGE /a 99999999999999999999-1\r\n",
    b"SET NOTIFY PORT 99999999999999999999999\r\n",
    b"Timeout: 99999999:23:59:59\r\n",
    b"Created: 9999-12-31T23:59:59-01:00\r\n",
    b"Content-Length: 0\r\n",
    b"PUB REPLY /a B\r\nSmuid: h/1\r\nCmuid: a/b/c\r\n",
]
fuzz_streams = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=40)), max_size=30
).map(b"".join)


@FUZZ
@given(fuzz_streams, st.data(), st.sampled_from([8, 32, 4096]))
def test_server_never_raises_and_is_chunking_independent(
    stream: bytes, data: st.DataObject, max_line: int
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    limits = {"max_line": max_line, "max_message": 50, "max_header_bytes": 200}
    whole = server_events([stream], **limits)
    assert whole[-1] is CLOSED
    for ev in whole[:-1]:
        assert isinstance(ev, ProtocolError) or type(ev).__module__ == c.__name__
    assert server_events(split(stream, cuts), **limits) == whole
    assert server_events([stream[i : i + 1] for i in range(len(stream))], **limits) == whole


@FUZZ
@given(st.binary(max_size=400), st.data())
def test_server_random_bytes(stream: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    whole = server_events([stream], max_line=16)
    assert server_events(split(stream, cuts), max_line=16) == whole


def _client_outcome(chunks: list[bytes]) -> list[object]:
    try:
        return client_events(chunks)
    except ProtocolError as e:
        return ["raised", e]


@FUZZ
@given(fuzz_streams, st.data())
def test_client_raises_only_protocol_errors(stream: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    whole = _client_outcome([stream])
    assert _client_outcome(split(stream, cuts)) == whole
    assert _client_outcome([stream[i : i + 1] for i in range(len(stream))]) == whole
