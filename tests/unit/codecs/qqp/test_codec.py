"""The QQP codec: netstrings, SXDF, the canonical form of section 5, the Greeting."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.qqp import netstring, protocol, sxdf
from broker.qqp.errors import OverLimit, QQPError
from tests.support.examples import examples

# The draft's Data element (section 5), indented as the draft prints it.
DRAFT_DATA = b"""4:Data=3%
  6:Action=28:qrpc://example.com/add_books
  10:ResourceID=28:34DH734HF64HF734@example.org
  8:Booklist=3@
    5%
      5:Title=16:Hardware Hacking
      6:Author=19:Kevin Mitnick (Ed.)
      4:Year=4:2004
      4:ISBN=13:1-932-26683-6
      9:Publisher=8:Syngress
    5%
      5:Title=12:We the Media
      6:Author=11:Dan Gillmor
      4:Year=4:2004
      4:ISBN=13:0-596-00733-7
      9:Publisher=8:O'Reilly
    5%
      5:Title=22:Matrix Decision Making
      6:Author=21:Alex Lowy & Phil Hood
      4:Year=4:2004
      4:ISBN=13:0-787-97292-4
      9:Publisher=11:Jossey-Bass
"""

# Section 5's canonicalized version, one line per line of the draft, the final newline kept.
DRAFT_CANONICAL = b"".join(line + b"\n" for line in [
    b"3%",
    b"6:Action=28:qrpc://example.com/add_books",
    b"10:ResourceID=28:34DH734HF64HF734@example.org",
    b"8:Booklist=3@",
    b"5%",
    b"5:Title=16:Hardware Hacking",
    b"6:Author=19:Kevin Mitnick (Ed.)",
    b"4:Year=4:2004",
    b"4:ISBN=13:1-932-26683-6",
    b"9:Publisher=8:Syngress",
    b"5%",
    b"5:Title=12:We the Media",
    b"6:Author=11:Dan Gillmor",
    b"4:Year=4:2004",
    b"4:ISBN=13:0-596-00733-7",
    b"9:Publisher=8:O'Reilly",
    b"5%",
    b"5:Title=22:Matrix Decision Making",
    b"6:Author=21:Alex Lowy & Phil Hood",
    b"4:Year=4:2004",
    b"4:ISBN=13:0-787-97292-4",
    b"9:Publisher=11:Jossey-Bass",
])


def test_draft_example_round_trips_and_canonicalises_byte_for_byte():
    elements = sxdf.parse_resource(DRAFT_DATA)
    data = elements["Data"]
    assert data["Action"] == b"qrpc://example.com/add_books"
    assert data["ResourceID"] == b"34DH734HF64HF734@example.org"
    assert [book["Title"] for book in data["Booklist"]] == [
        b"Hardware Hacking", b"We the Media", b"Matrix Decision Making"]
    assert sxdf.encode_resource(elements) == DRAFT_DATA
    assert sxdf.canonical(data) == DRAFT_CANONICAL
    # The canonical form is the element with its indentation removed.
    stripped = b"\n".join(line.lstrip(b" ") for line in DRAFT_DATA.split(b"\n"))
    assert stripped[len(b"4:Data="):] == DRAFT_CANONICAL
    assert sxdf.parse_value(DRAFT_CANONICAL) == data
    item = protocol.parse_item(DRAFT_DATA)
    assert item.canonical_data == DRAFT_CANONICAL
    assert (item.action, item.resource_id) == (
        "qrpc://example.com/add_books", "34DH734HF64HF734@example.org")


def test_spaces_inside_strings_are_kept():
    data = {"Action": b"smqp:/a", "ResourceID": b"r", "Text": b"line\n   indented\n"}
    body = sxdf.encode_resource({"Data": data})
    assert sxdf.parse_resource(body)["Data"] == data
    assert b"   indented" in sxdf.canonical(data)


@pytest.mark.parametrize("bad", [
    b"01:a,", b"1:ab", b"x:a,", b"12345678901:", b"-1:a,", b"1:a;", b" 1:a,",
])
def test_netstring_refusals(bad):
    reader = netstring.NetstringReader()
    with pytest.raises(QQPError):
        reader.feed(bad + b"1:x,")


def test_whole_items_before_a_fault_are_returned_then_the_fault_raised():
    reader = netstring.NetstringReader()
    assert reader.feed(b"1:a,2:bc,01:x,") == [b"a", b"bc"]
    assert isinstance(reader.error, QQPError)
    with pytest.raises(QQPError):
        reader.feed(b"1:d,")


def test_netstring_split_reads_and_limits():
    reader = netstring.NetstringReader(item_limit=10, session_limit=16)
    stream = b"3:abc,0:,"
    out = []
    for i in range(len(stream)):
        out += reader.feed(stream[i:i + 1])
    assert out == [b"abc", b""] and not reader.pending
    assert reader.received == 6 + 3
    with pytest.raises(OverLimit) as excinfo:
        reader.feed(b"5:")  # 5 + 1 + 2 = 8 > 16 - 9 left
    assert excinfo.value.session
    with pytest.raises(OverLimit) as excinfo:
        netstring.NetstringReader(item_limit=10).feed(b"9:")
    assert not excinfo.value.session


@pytest.mark.parametrize("bad", [
    b"4:Data",                      # no '='
    b"4:Data=3:abc",                # no newline after the string
    b"4:Data=2%\n1:a=1:b\n",        # fewer entries than announced
    b"4:Data=1:a\n4:Data=1:b\n",    # an element repeated at the top
    b"4:Data=2%\n1:a=1:b\n1:a=1:b\n",  # a key repeated in a map
    b"4:Data=00:\n",                # a leading zero
    b"4:Data=1#\n",                 # no such kind
    b"4:Data=9:abc\n",              # a string past the end
    b"4:Data= 1:a\n",               # a space not at a line's start
])
def test_sxdf_refusals(bad):
    with pytest.raises(QQPError):
        sxdf.parse_resource(bad)


def test_item_requires_action_and_resource_id():
    with pytest.raises(QQPError):
        protocol.parse_item(sxdf.encode_resource({"Data": {"Action": b"smqp:/a"}}))
    with pytest.raises(QQPError):
        protocol.parse_item(sxdf.encode_resource({"Other": b"x"}))


def test_greeting_round_trip_and_status():
    greeting = protocol.Greeting(item_limit=1000, session_limit=5000,
                                 exceptions_to="qrpc://localhost/exceptions")
    body = netstring.NetstringReader().feed(greeting.encode())[0]
    assert protocol.Greeting.parse(body) == greeting
    assert b"12:Capabilities=1@\n  4:smqp\n" in body
    assert protocol.status(2, "stored") == b"10:200 stored,"
    assert protocol.parse_status(b"200 stored") == (2, "200 stored")


keys = st.text(min_size=0, max_size=8)
values = st.recursive(
    st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(keys, values, max_size=5), st.booleans())
def test_round_trip_property(elements, pretty):
    body = sxdf.encode_resource(elements, pretty=pretty)
    assert sxdf.parse_resource(body) == elements
    framed = netstring.encode(body)
    assert netstring.NetstringReader().feed(framed) == [body]
    for value in elements.values():
        assert sxdf.parse_value(sxdf.canonical(value)) == value


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            del buf[min(pos, len(buf) - 1)]
        elif op == 1:
            buf.insert(pos, rng.choice(b"0123456789:,%@=\n x"))
        elif op == 2 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        else:
            buf[pos:pos] = buf[rng.randrange(len(buf) + 1):][:rng.randint(0, 8)]
    return bytes(buf)


def test_fuzz_mutated_streams():
    """10,000 mutated streams: only QQPError ever, and each body handed out is complete
    (it parses as an item, or raises QQPError: never a partial item)."""
    rng = random.Random(2804)
    seeds = [
        netstring.encode(DRAFT_DATA),
        protocol.encode_item({"Action": b"smqp:/a", "ResourceID": b"1", "P": [b"x", {}]}),
        protocol.Greeting(10, 100).encode(),
    ]
    complete = 0
    for _ in range(10_000):
        stream = b"".join(rng.choice(seeds) for _ in range(rng.randint(1, 3)))
        stream = _mutate(rng, stream)
        reader = netstring.NetstringReader(item_limit=4096)
        cut = rng.randrange(len(stream) + 1)
        try:
            bodies = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        except QQPError:
            continue
        for body in bodies:
            try:
                item = protocol.parse_item(body)
            except QQPError:
                continue
            complete += 1
            assert sxdf.parse_value(item.canonical_data) == item.data
    assert complete > 0
