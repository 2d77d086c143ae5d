"""The sans-IO XMPP codec (broker/xmpp): frames, the stream's state machine, the IQ subset
and payloads, without a socket (the wire itself: tests/test_e2e_xmpp*.py)."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.domain.message import DataSection, Message
from broker.xmpp import payload as p
from broker.xmpp import stanzas as s
from broker.xmpp import stream as xs
from broker.xmpp.xml import StreamFault, parse_frame, serialize
from tests.support.examples import examples

OPEN = "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='localhost' version='1.0'/>"


def ready_stream() -> xs.ServerStream:
    stream = xs.ServerStream("localhost", 1024, ["SCRAM-SHA-256", "PLAIN"])
    assert isinstance(stream.receive(OPEN), xs.Opened)
    stream.authenticated()
    assert isinstance(stream.receive(OPEN), xs.Opened)
    stream.bound()
    return stream


@pytest.mark.parametrize("frame, condition", [
    ("<iq", "not-well-formed"),
    ("<a/><b/>", "not-well-formed"),
    ("<!DOCTYPE a [<!ENTITY x 'y'>]><a>&x;</a>", "restricted-xml"),
    ("<a><?pi x?></a>", "restricted-xml"),
    ("<a><!-- c --></a>", "restricted-xml"),
    ("<?pi x?><a/>", "restricted-xml"),  # before the stanza (issue 34 item 10)
    ("<a/><?pi x?>", "restricted-xml"),
    ("<!-- c --><a/>", "restricted-xml"),
    ("<?xml version='1.0'?><?pi x?><a/>", "restricted-xml"),
    ("<a>" + "x" * 2000 + "</a>", "policy-violation"),
])
def test_bad_frames(frame, condition):
    with pytest.raises(StreamFault) as info:
        parse_frame(frame, 1024)
    assert info.value.condition == condition


def test_xml_declaration_is_allowed():
    assert parse_frame("<?xml version='1.0'?><a/>", 1024).tag == "a"


def test_stream_states():
    stream = xs.ServerStream("localhost", 1024, ["SCRAM-SHA-256"])
    event = stream.receive("<iq xmlns='jabber:client' type='get' id='1'/>")
    assert isinstance(event, xs.Fault) and event.condition == "not-authorized"
    assert stream.receive(OPEN) is None  # closed

    stream = xs.ServerStream("localhost", 1024, ["SCRAM-SHA-256"])
    opened = stream.receive(OPEN)
    assert isinstance(opened, xs.Opened) and len(opened.frames) == 2
    assert "SCRAM-SHA-256" in opened.frames[1]
    fault = stream.receive("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'/>")
    assert isinstance(fault, xs.SaslFault) and fault.condition == "invalid-mechanism"
    start = stream.receive("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' "
                           "mechanism='SCRAM-SHA-256'>biwsbj1ib2Is</auth>")
    assert isinstance(start, xs.AuthStart) and start.initial == b"n,,n=bob,"
    bad = stream.receive("<response xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>!!</response>")
    assert isinstance(bad, xs.SaslFault) and bad.condition == "incorrect-encoding"


def test_open_to_another_host_and_wrong_namespace():
    stream = xs.ServerStream("localhost", 1024, [])
    event = stream.receive(OPEN.replace("localhost", "other"))
    assert isinstance(event, xs.Fault) and event.condition == "host-unknown"
    stream = ready_stream()
    event = stream.receive("<iq xmlns='urn:nope' type='get' id='1'/>")
    assert isinstance(event, xs.Fault) and event.condition == "invalid-namespace"
    stream = ready_stream()
    event = stream.receive("<foo xmlns='jabber:client'/>")
    assert isinstance(event, xs.Fault) and event.condition == "unsupported-stanza-type"


def iq(body: str, kind: str = "set") -> s.Iq:
    return s.parse_iq(ET.fromstring(f"<iq xmlns='jabber:client' type='{kind}' id='i' "
                                    f"to='pubsub.localhost'>{body}</iq>"))


def test_pubsub_commands():
    ps = "http://jabber.org/protocol/pubsub"
    cmd = iq(f"<pubsub xmlns='{ps}'><publish node='/a'><item id='x'><p xmlns='urn:p'/>"
             "</item></publish></pubsub>").command
    assert isinstance(cmd, s.Publish) and cmd.item_id == "x" and cmd.payload.tag == "{urn:p}p"
    cmd = iq(f"<pubsub xmlns='{ps}'><subscribe node='/a' jid='b@l'/><options><x xmlns="
             "'jabber:x:data' type='submit'><field var='pubsub#queue_requests'><value>4"
             "</value></field></x></options></pubsub>").command
    assert isinstance(cmd, s.Subscribe) and cmd.options == {"pubsub#queue_requests": ["4"]}
    cmd = iq("<unlock xmlns='urn:xmpp:pubsub:queueing:0' node='/q'><item id='7'/></unlock>")
    assert isinstance(cmd.command, s.Unlock) and cmd.command.ids == ["7"]
    # XEP-0254 §2.4's own form: inside <pubsub/>, sent as a get (issue 34 item 8)
    for kind in ("get", "set"):
        cmd = iq(f"<pubsub xmlns='{ps}'><unlock xmlns='urn:xmpp:pubsub:queueing:0' node='/q'>"
                 "<item id='7'/><item id='8'/></unlock></pubsub>", kind)
        assert isinstance(cmd.command, s.Unlock)
        assert (cmd.command.node, cmd.command.ids) == ("/q", ["7", "8"])
    with pytest.raises(s.IqFault) as info:
        iq(f"<pubsub xmlns='{ps}'><unlock xmlns='urn:xmpp:pubsub:queueing:0' node='/q'/>"
           "</pubsub>")
    assert (info.value.condition, info.value.pubsub) == ("bad-request", "item-required")
    cmd = iq(f"<pubsub xmlns='{ps}'><items node='/a' max_items='2'/></pubsub>", "get").command
    assert isinstance(cmd, s.Items) and cmd.max_items == 2
    with pytest.raises(s.IqFault) as info:
        iq(f"<pubsub xmlns='{ps}'><purge node='/a'/></pubsub>")
    assert info.value.condition == "feature-not-implemented"
    with pytest.raises(s.IqFault) as info:
        iq(f"<pubsub xmlns='{ps}'><retract node='/a'/></pubsub>")
    assert info.value.condition == "bad-request"
    with pytest.raises(s.IqFault):
        iq(f"<pubsub xmlns='{ps}'><items node='/a' max_items='x'/></pubsub>", "get")


def test_payload_round_trip_and_smqp_messages():
    element = ET.fromstring("<job xmlns='urn:j' a='1'><n>&lt;1&gt;</n><m xmlns=''/></job>")
    stored = p.message_of(element)
    assert stored.sections[0].content_type == "application/xml"
    text = p.payload_xml(stored, 4096, xmpp_item=True)
    again = ET.fromstring(text)
    assert ET.tostring(again) == ET.tostring(element)
    other = Message(headers=[("Name", "x & y")], sections=[
        DataSection([("Content-Type", "text/plain")], b"\x00\xff"),
        DataSection([("Content-Type", "application/xml")], b"<a xmlns='urn:a'/>"),
        DataSection([("Content-Type", "application/xml")], b"<not xml"),
    ])
    wrapped = ET.fromstring(p.payload_xml(other, 4096))
    assert wrapped.tag == "{urn:smqp:message:0}message"
    sections = wrapped.findall("{urn:smqp:message:0}section")
    assert base64.b64decode(sections[0].text) == b"\x00\xff"
    assert next(iter(sections[1])).tag == "{urn:a}a"
    assert sections[2].get("encoding") == "base64"


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_an_event_or_a_fault(text):
    """Whatever a frame holds, the stream gives an event or a stream error, never raises."""
    stream = ready_stream()
    event = stream.receive(text)
    assert event is not None


@settings(max_examples=examples(200), deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=50))
def test_serialized_text_parses_back(value):
    element = ET.Element("{urn:t}v", {"a": value})
    element.text = value
    back = parse_frame(serialize(element), 1 << 16)
    assert back.get("a") == value and (back.text or "") == value


@pytest.mark.parametrize("policy, tls, peer, allowed", [
    ("loopback", False, "127.0.0.1", True), ("loopback", False, "::1", True),
    ("loopback", False, "::ffff:127.0.0.1", True), ("loopback", False, "10.0.0.5", False),
    ("loopback", True, "10.0.0.5", True), ("no", False, "127.0.0.1", False),
    ("yes", False, "10.0.0.5", True), ("loopback", False, "", False),
])
def test_plain_is_offered_as_smqp_xmpp_plain_says(settings, policy, tls, peer, allowed):
    from broker.services.auth import xmpp_plain_allowed

    settings.SMQP_XMPP_PLAIN = policy
    assert xmpp_plain_allowed(tls, peer) is allowed


@given(st.text(min_size=1, max_size=40), st.sampled_from(["lease", "revoked", "removed", ""]))
def test_subscription_state_notification_parses_back(node, reason):
    node = "".join(c for c in node if c.isprintable()) or "/n"
    text = s.subscription_event("pubsub.localhost", "bob@localhost/r", node,
                                "bob@localhost", reason)
    element = ET.fromstring(text)
    sub = element.find(f"{{{s.PUBSUB_EVENT}}}event/{{{s.PUBSUB_EVENT}}}subscription")
    assert (sub.get("node"), sub.get("jid"), sub.get("subscription")) == (
        node, "bob@localhost", "none")
    why = element.find(f"{{{s.SUBSCRIPTION_REASON}}}reason")
    assert (why.text if why is not None else "") == reason
