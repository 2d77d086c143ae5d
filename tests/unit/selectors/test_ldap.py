"""The RFC-2254 / LDAP selector class (profile §9.2; RFC 4515 syntax, RFC 4511 §4.5.1.7
evaluation), table-driven: selector → three-valued result (None: Undefined), or the 567
error (with its column) it must get."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.services.selectors import SelectorError, compile_selector, message_view

VIEW = message_view(
    topic="/stocks/ibm", publisher="jtegen", name="IBM Quote", priority=3,
    created=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), timeout=60, depth=0, size=42,
    content_type="text/plain",
    headers=[("X-Region", "EMEA"), ("X-Price", "24.5"), ("X-Qty", "100"), ("X-Code", "007"),
             ("X-Empty", ""), ("X-Paren", "a(b)c"), ("X-Star", "5*"), ("X-Back", "c:\\dir"),
             ("X-City", "New  York"), ("X-Dash", "e-mail"), ("X-Uni", "Zürich"),
             ("X-Neg", "-5")])

T, F, U = True, False, None

CASES: list[tuple[str, bool | None]] = [
    # --- equality: case-insensitive strings, numbers as numbers
    ("(x-region=EMEA)", T), ("(x-region=emea)", T), ("(X-REGION=Emea)", T),
    ("(x-region=apac)", F), ("(x_region=emea)", T), ("x-region=emea", T),
    ("(priority=3)", T), ("(priority=03)", T), ("(priority=3.0)", T), ("(priority=4)", F),
    ("(x-price=24.5)", T), ("(x-price=24.50)", T), ("(x-qty=1e2)", T), ("(x-code=7)", T),
    ("(x-code=007)", T), ("(x-neg=-5)", T), ("(size=42)", T), ("(timeout=60)", T),
    ("(depth=0)", T), ("(topic=/stocks/ibm)", T), ("(topic=/STOCKS/IBM)", T),
    ("(publisher=jtegen)", T), ("(name=ibm quote)", T), ("(name=IBM  Quote)", T),
    ("(name= ibm quote )", T), ("(content-type=text/plain)", T),
    ("(content_type=TEXT/PLAIN)", T), ("(x-city=new york)", T), ("(x-empty=)", T),
    ("(x-region=)", F), ("(x-uni=zürich)", T), ("(x-uni=ZÜRICH)", T),
    ("(created=2026-01-02T03:04:05.00Z)", T),
    # --- escapes (RFC 4515 \XX, UTF-8)
    ("(x-paren=a\\28b\\29c)", T), ("(x-star=5\\2a)", T), ("(x-back=c:\\5cdir)", T),
    ("(x-uni=Z\\c3\\bcrich)", T), ("(x-region=\\45MEA)", T), ("(x-star=5\\2A)", T),
    # --- missing attributes: FALSE (RFC 4511 §4.5.1.7: Undefined is for unrecognised
    # attributes and rules that do not apply), so a negation is TRUE
    ("(x-missing=1)", F), ("(x-missing>=1)", F), ("(x-missing<=1)", F),
    ("(x-missing~=a)", F), ("(x-missing=a*)", F), ("(x-missing=*)", F),
    ("(!(x-missing=1))", T), ("(!(x-missing=*))", T), ("(!(x-missing>=7))", T),
    ("(!(x-missing=*a*))", T),
    # --- spaces inside substring pieces are significant (runs of them count as one)
    ("(x-region=*em *ea)", F), ("(x-region=em*)", T), ("(x-city=new *york)", T),
    ("(x-city=*w y*)", T), ("(x-city=*wy*)", F), ("(x-city=new*)", T), ("(x-city=*k )", F),
    # --- presence
    ("(x-region=*)", T), ("(x-empty=*)", T), ("(priority=*)", T), ("(sequence=*)", F),
    # --- ordering
    ("(priority>=3)", T), ("(priority>=4)", F), ("(priority<=3)", T), ("(priority<=2)", F),
    ("(x-price>=24.4)", T), ("(x-price<=24)", F), ("(x-qty>=99)", T), ("(x-qty>=1000)", F),
    ("(x-neg<=-1)", T), ("(x-region>=e)", T), ("(x-region>=F)", F),
    ("(x-region<=emea)", T), ("(x-region<=EMEA)", T), ("(x-region<=emeb)", T),
    ("(x-code>=6)", T),
    # --- approximate
    ("(x-region~=emea)", T), ("(x-dash~=email)", T), ("(x-dash~=E Mail)", T),
    ("(x-city~=newyork)", T), ("(x-region~=apac)", F),
    # --- substrings
    ("(topic=/stocks/*)", T), ("(topic=*/ibm)", T), ("(topic=*stocks*)", T),
    ("(topic=/STOCKS*)", T), ("(topic=/bonds/*)", F), ("(topic=*/msft)", F),
    ("(topic=/*/*)", T), ("(topic=/s*k*/i*m)", T), ("(topic=/s*x*/i*m)", F),
    ("(x-region=e*a)", T), ("(x-region=em*ma)", F), ("(x-region=emea*)", T),
    ("(x-region=*emea)", T), ("(x-region=*m*)", T), ("(x-region=*)", T),
    ("(name=*quote)", T), ("(x-city=new york*)", T), ("(x-star=5\\2a*)", T),
    ("(x-code=00*)", T), ("(x-region=ab*)", F),
    # --- and / or / not
    ("(&(x-region=emea)(priority=3))", T), ("(&(x-region=emea)(priority=4))", F),
    ("(|(x-region=apac)(priority=3))", T), ("(|(x-region=apac)(priority=4))", F),
    ("(!(x-region=apac))", T), ("(!(x-region=emea))", F), ("(!(!(x-region=emea)))", T),
    ("(&(x-region=emea))", T), ("(|(x-region=emea))", T),
    ("(&(x-region=emea)(x-missing=1))", F), ("(&(x-region=apac)(x-missing=1))", F),
    ("(|(x-region=emea)(x-missing=1))", T), ("(|(x-region=apac)(x-missing=1))", F),
    ("(!(&(x-region=apac)(x-missing=1)))", T),
    ("(&(|(x-region=apac)(x-region=emea))(!(priority>=5))(topic=/stocks/*))", T),
    ("(&(|(x-region=apac)(x-region=amer))(topic=/stocks/*))", F),
]

ERRORS: list[tuple[str, int]] = [
    ("(", 2), ("()", 2), ("(x-region=emea", 15), ("x-region=emea)", 14),
    ("(x-region)", 10), ("(=emea)", 2), ("(x-region~emea)", 10), ("(&)", 3),
    ("(|)", 3), ("(!)", 3), ("(!(a=1)(b=2))", 8), ("(a=1)(b=2)", 6),
    ("(a=\\zz)", 4), ("(a=\\2)", 4), ("(a=**)", 5), ("(a=b**c)", 6), ("(a:dn:=1)", 3),
    ("(a:=1)", 3), ("(1a=1)", 2), ("(a b=1)", 3), ("(a=\\ff)", 4), ("(a=\\c3)", 4),
    ("(&(a=1)", 8), ("(a>1)", 3), ("(a<1)", 3), ("(a=1))", 6),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_ldap_case(text: str, expected: bool | None) -> None:
    selector = compile_selector("RFC-2254", text)
    assert selector.evaluate(VIEW) is expected, text
    assert compile_selector("LDAP", text).evaluate(VIEW) is expected


@pytest.mark.parametrize(("text", "column"), ERRORS)
def test_ldap_error(text: str, column: int) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector("LDAP", text)
    assert caught.value.code == 567
    assert caught.value.column == column, caught.value.text


def test_enough_cases() -> None:
    assert len(CASES) + len(ERRORS) >= 80


def test_extensible_match_named() -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector("LDAP", "(cn:caseExactMatch:=Fred)")
    assert "extensible match not supported" in caught.value.text


def test_depth_bounded(settings) -> None:
    settings.SMQP_SELECTOR_MAX_DEPTH = 20
    deep = "(!" * 30 + "(a=1)" + ")" * 30
    with pytest.raises(SelectorError) as caught:
        compile_selector("LDAP", deep)
    assert "nested deeper" in caught.value.text
    wide = "(|" + "(a=1)" * 150 + ")"
    assert compile_selector("LDAP", wide).evaluate(VIEW) is False  # a missing attribute
