"""Properties of both selector classes, and fuzzing of their parsers and of the SUB / UNSUB
grammar that carries them.

* A selector and its negation never both match a message that has every identifier they
  name (three-valued logic: both may fail, never both succeed).
* Any text at all either compiles or is refused with 566 / 567: never another exception,
  never a hang (hypothesis' deadline).
"""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.services.selectors import SelectorError, compile_selector, message_view
from broker.smqp.commands import Subscribe, Unsubscribe, parse_command_line, serialize_command
from broker.smqp.errors import ProtocolError
from tests.support.examples import examples

NUM_IDS = ["X_A", "X_B", "Priority"]
STR_IDS = ["X_S", "X_T"]

header_text = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
    st.text(alphabet="abcXYZ_% ", max_size=6),
)


@st.composite
def messages(draw):
    return message_view(
        topic="/t", priority=draw(st.integers(1, 9)),
        headers=[("X-A", draw(header_text)), ("X-B", draw(header_text)),
                 ("X-S", draw(header_text)), ("X-T", draw(header_text))])


def _string_literal(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


num_atom = st.one_of(st.sampled_from(NUM_IDS), st.integers(-50, 50).map(str),
                     st.floats(-100, 100, allow_nan=False).map(lambda f: f"{abs(f):.2f}"))
str_atom = st.one_of(st.sampled_from(STR_IDS),
                     st.text(alphabet="abc'XYZ_% ", max_size=5).map(_string_literal))


def _num_expr(inner):
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"-{e}"))


num_expr = st.recursive(num_atom, _num_expr, max_leaves=4)

jms_predicate = st.one_of(
    st.tuples(num_expr, st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), num_expr).map(
        " ".join),
    st.tuples(str_atom, st.sampled_from(["=", "<>"]), str_atom).map(" ".join),
    st.tuples(num_expr, st.booleans(), num_expr, num_expr).map(
        lambda t: f"{t[0]} {'NOT ' if t[1] else ''}BETWEEN {t[2]} AND {t[3]}"),
    st.tuples(st.sampled_from(STR_IDS), st.booleans(),
              st.lists(st.text(alphabet="abc1 ", max_size=3), min_size=1, max_size=3)).map(
        lambda t: f"{t[0]} {'NOT ' if t[1] else ''}IN ("
                  + ", ".join(map(_string_literal, t[2])) + ")"),
    st.tuples(st.sampled_from(STR_IDS + NUM_IDS), st.booleans(),
              st.text(alphabet="ab1_%!", max_size=5)).map(
        lambda t: f"{t[0]} {'NOT ' if t[1] else ''}LIKE {_string_literal(t[2])}"
                  + (" ESCAPE '!'" if not t[2].endswith("!") else "")),
    st.tuples(st.sampled_from(STR_IDS + NUM_IDS), st.booleans()).map(
        lambda t: f"{t[0]} IS {'NOT ' if t[1] else ''}NULL"),
    st.sampled_from(["TRUE", "FALSE"]),
)


def _jms_combine(inner):
    return st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"NOT ({e})"))


jms_selectors = st.recursive(jms_predicate, _jms_combine, max_leaves=6)

ldap_value = st.text(alphabet="abcXYZ019.-", min_size=1, max_size=4)
ldap_item = st.one_of(
    st.tuples(st.sampled_from(["x-a", "x-b", "x-s", "x-t", "priority"]),
              st.sampled_from(["=", "~=", ">=", "<="]), ldap_value).map(
        lambda t: f"({t[0]}{t[1]}{t[2]})"),
    st.tuples(st.sampled_from(["x-a", "x-s", "x-t"]), ldap_value, ldap_value).map(
        lambda t: f"({t[0]}={t[1]}*{t[2]})"),
    st.sampled_from(["x-a", "x-s", "x-missing"]).map(lambda a: f"({a}=*)"),
)


def _ldap_combine(inner):
    return st.one_of(
        st.tuples(st.sampled_from("&|"), st.lists(inner, min_size=1, max_size=3)).map(
            lambda t: f"({t[0]}{''.join(t[1])})"),
        inner.map(lambda f: f"(!{f})"))


ldap_selectors = st.recursive(ldap_item, _ldap_combine, max_leaves=6)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jms_selectors, messages())
def test_jms_selector_and_negation_never_both_match(text: str, view) -> None:
    try:
        selector = compile_selector("JMS", text)
    except SelectorError as exc:
        assert exc.code == 567  # a generated type mismatch (e.g. LIKE on a number literal)
        return
    negation = compile_selector("JMS", f"NOT ({text})")
    assert not (selector.matches(view) and negation.matches(view))
    if selector.evaluate(view) is not None:
        assert negation.evaluate(view) is (not selector.evaluate(view))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ldap_selectors, messages())
def test_ldap_selector_and_negation_never_both_match(text: str, view) -> None:
    selector = compile_selector("LDAP", text)
    negation = compile_selector("LDAP", f"(!{text})")
    assert not (selector.matches(view) and negation.matches(view))


JMS_ALPHABET = string.ascii_letters[:8] + string.digits[:4] + " '()=<>+-*/_%.,!\\\t" + "é"
LDAP_ALPHABET = "abxX019 ()&|!=~<>*\\:.-_" + "é\x00"


@settings(max_examples=examples(1500), deadline=2000)
@given(st.text(alphabet=JMS_ALPHABET, max_size=60))
def test_fuzz_jms_parser(text: str) -> None:
    _compile_or_refuse("JMS", text)


@settings(max_examples=examples(1500), deadline=2000)
@given(st.text(alphabet=LDAP_ALPHABET, max_size=60))
def test_fuzz_ldap_parser(text: str) -> None:
    _compile_or_refuse("LDAP", text)


@settings(max_examples=examples(500), deadline=2000)
@given(st.text(max_size=80), st.sampled_from(["JMS", "LDAP", "RFC-2254", "jms", "X"]))
def test_fuzz_any_text(text: str, cls: str) -> None:
    _compile_or_refuse(cls, text)


@settings(max_examples=examples(300), deadline=2000)
@given(st.sampled_from(["JMS", "LDAP"]),
       st.lists(st.sampled_from(["(", ")", "NOT ", "(!", "a=1", "a = 1", " AND ", "(&"]),
                max_size=200))
def test_fuzz_nesting(cls: str, parts: list[str]) -> None:
    _compile_or_refuse(cls, "".join(parts))


def _compile_or_refuse(cls: str, text: str) -> None:
    try:
        selector = compile_selector(cls, text)
    except SelectorError as exc:
        assert exc.code in (566, 567)
        assert "\r" not in exc.text and "\n" not in exc.text
        if exc.code == 567:
            assert (exc.column is not None and 1 <= exc.column <= len(text.strip()) + 1) or \
                "longer than" in exc.text
        return
    selector.evaluate(message_view(topic="/t", headers=[("X-A", "1"), ("A", "x")]))


# ------------------------------------------------------------------ the SMQP grammar


@pytest.mark.parametrize(("line", "expected"), [
    ("SUB MESSAGE /t SELECTOR JMS X_A = 1", Subscribe("MESSAGE", None, None, None,
                                                      ("JMS", "X_A = 1"))),
    ("SUB MESSAGE /t LEASE 00:00:02", Subscribe("MESSAGE", None, None, 2, None)),
    ("sub message /t lease 00:01:00 selector ldap (x-a=1)",
     Subscribe("MESSAGE", None, None, 60, ("ldap", "(x-a=1)"))),
    ("SUB MESSAGE /t D08232001T14451246Z LEASE 01:00:00 SELECTOR JMS  a  =  'x  y' ",
     Subscribe("MESSAGE", None, "since", 3600, ("JMS", "a  =  'x  y'"))),
    ("UNSUB MESSAGE /t SELECTOR JMS X_A = 1", Unsubscribe("MESSAGE", None, ("JMS", "X_A = 1"))),
])
def test_sub_grammar(line: str, expected) -> None:
    cmd = parse_command_line(line)
    assert type(cmd) is type(expected)
    assert str(cmd.pattern) == "/t"
    assert cmd.selector == expected.selector
    if isinstance(cmd, Subscribe):
        assert cmd.lease == expected.lease
        assert (cmd.since is not None) == (expected.since is not None)
    # What the client library writes parses back to the same command.
    assert parse_command_line(serialize_command(cmd).decode().rstrip("\r\n")) == cmd


@pytest.mark.parametrize("line", [
    "SUB MESSAGE /t LEASE", "SUB MESSAGE /t LEASE -1", "SUB MESSAGE /t LEASE 00:00:00",
    "SUB MESSAGE /t LEASE soon", "SUB MESSAGE /t SELECTOR", "SUB MESSAGE /t SELECTOR JMS",
    "SUB MESSAGE /t SELECTOR JMS   ", "SUB TOPIC /t SELECTOR JMS a = 1",
    "SUB MESSAGE /t LEASE 00:00:01 extra", "SUB MESSAGE /t SELECTOR JMS a = 1 LEASE",
    "UNSUB MESSAGE /t SELECTOR", "UNSUB TOPIC /t SELECTOR JMS a = 1",
    "SUB MESSAGE /t whenever",
])
def test_sub_grammar_refusals(line: str) -> None:
    # (The last but one is a selector "a = 1 LEASE": the text runs to the end of the line,
    # and the services refuse it with 567; the codec takes it.)
    if line == "SUB MESSAGE /t SELECTOR JMS a = 1 LEASE":
        assert parse_command_line(line).selector == ("JMS", "a = 1 LEASE")
        return
    with pytest.raises(ProtocolError) as caught:
        parse_command_line(line)
    assert caught.value.code == 400


@settings(max_examples=examples(1000), deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="SUBMESAGLTCORJ /t:0123456789()=-'", max_size=70))
def test_fuzz_sub_lines(rest: str) -> None:
    for prefix in ("SUB MESSAGE /t ", "UNSUB MESSAGE /t "):
        try:
            parse_command_line(prefix + rest)
        except ProtocolError as exc:
            assert exc.code == 400
