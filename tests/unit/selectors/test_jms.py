"""The JMS selector class (profile §9.2; JMS 1.1 §3.8), table-driven: each case is a
selector, the message it is evaluated on, and the three-valued result (True, False, None for
UNKNOWN), or the 567 error (with its column) it must get."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.services.selectors import SelectorError, compile_selector, message_view

VIEW = message_view(
    topic="/stocks/ibm", publisher="jtegen", name="IBM quote", priority=3,
    created=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), timeout=60, depth=0, size=42,
    content_type="text/plain",
    headers=[("X-Region", "emea"), ("X-Price", "24.5"), ("X-Qty", "100"), ("X-Code", "007"),
             ("X-Empty", ""), ("X-Quote", "it's"), ("X-Pct", "50%"), ("X-Under", "a_b"),
             ("X-Neg", "-5"), ("X-Mixed", "AbC"), ("X-Sci", "1e3"), ("X-Zero", "0"),
             ("X-Spaced", "new york")])

T, F, U = True, False, None

CASES: list[tuple[str, bool | None]] = [
    # --- literals and plain comparisons
    ("TRUE", T), ("FALSE", F), ("true", T), ("False", F),
    ("1 = 1", T), ("1 = 2", F), ("1 <> 2", T), ("2 <> 2", F),
    ("1 < 2", T), ("2 < 1", F), ("2 > 1", T), ("1 > 2", F),
    ("2 >= 2", T), ("1 >= 2", F), ("2 <= 2", T), ("3 <= 2", F),
    ("'a' = 'a'", T), ("'a' = 'b'", F), ("'a' <> 'b'", T), ("'' = ''", T),
    ("'it''s' = 'it''s'", T), ("TRUE = TRUE", T), ("TRUE <> FALSE", T), ("TRUE = FALSE", F),
    ("1.5 = 1.5", T), ("1 = 1.0", T), ("1.0E1 = 10", T), ("7E3 = 7000", T), (".5 = 0.5", T),
    ("5. = 5", T), ("1e0 = 1", T), ("2.5e-1 = 0.25", T),
    # --- identifiers: headers, case-insensitive, _ for -
    ("X_Region = 'emea'", T), ("x_region = 'emea'", T), ("X_REGION = 'emea'", T),
    ("X_Region = 'EMEA'", F), ("X_Region <> 'apac'", T), ("X_Region = 'apac'", F),
    ("X_Mixed = 'AbC'", T), ("X_Mixed = 'abc'", F),
    ("Priority = 3", T), ("priority < 5", T), ("Priority > 3", F), ("Priority = '3'", F),
    ("Size = 42", T), ("Timeout = 60", T), ("Depth = 0", T),
    ("Topic = '/stocks/ibm'", T), ("Publisher = 'jtegen'", T), ("Name = 'IBM quote'", T),
    ("Content_Type = 'text/plain'", T), ("content_type = 'text/html'", F),
    ("Created = '2026-01-02T03:04:05.00Z'", T), ("Created LIKE '2026-01-%'", T),
    ("X_Empty = ''", T), ("X_Quote = 'it''s'", T), ("X_Spaced = 'new york'", T),
    # --- numbers in headers compare as numbers
    ("X_Price = 24.5", T), ("X_Price > 24", T), ("X_Price < 24.5", F), ("X_Price >= 24.5", T),
    ("X_Qty = 100", T), ("X_Qty = 100.0", T), ("X_Qty = '100'", F), ("X_Code = 7", T),
    ("X_Code = '007'", F), ("X_Neg < 0", T), ("X_Neg = -5", T), ("X_Sci = 1000", T),
    ("X_Zero = 0", T), ("X_Zero = FALSE", F),
    # --- unlike types: FALSE, never UNKNOWN
    ("X_Region = 1", F), ("X_Region <> 1", F), ("X_Qty = 'x'", F), ("X_Region = TRUE", F),
    ("NOT (X_Region = 1)", T),
    # --- strings have no order: FALSE at run time
    ("X_Region < X_Mixed", F), ("X_Region >= X_Region", F),
    # --- arithmetic and precedence
    ("1 + 2 = 3", T), ("2 * 3 + 1 = 7", T), ("1 + 2 * 3 = 7", T), ("(1 + 2) * 3 = 9", T),
    ("10 - 2 - 3 = 5", T), ("8 / 2 / 2 = 2", T), ("7 / 2 = 3", T), ("-7 / 2 = -3", T),
    ("7 / -2 = -3", T), ("7.0 / 2 = 3.5", T), ("-3 = 0 - 3", T), ("- -3 = 3", T),
    ("+3 = 3", T), ("-X_Qty = -100", T), ("X_Qty * 2 = 200", T), ("X_Price * 2 = 49", T),
    ("X_Qty / 3 = 33", T), ("X_Qty + X_Price = 124.5", T), ("Priority * Size = 126", T),
    ("1 / 0 = 1", U), ("X_Qty / X_Zero > 0", U), ("X_Region + 1 = 1", U),
    ("X_Missing + 1 = 1", U), ("X_Missing * 0 = 0", U),
    # --- NULL (missing identifiers) and three-valued logic
    ("X_Missing = 1", U), ("X_Missing <> 1", U), ("X_Missing = 'a'", U),
    ("NOT X_Missing = 1", U), ("X_Missing = X_Missing", U),
    ("X_Missing IS NULL", T), ("X_Missing IS NOT NULL", F), ("X_Region IS NULL", F),
    ("X_Region IS NOT NULL", T), ("X_Empty IS NULL", F), ("x_missing is null", T),
    ("TRUE AND X_Missing = 1", U), ("FALSE AND X_Missing = 1", F),
    ("X_Missing = 1 AND FALSE", F), ("TRUE OR X_Missing = 1", T),
    ("X_Missing = 1 OR TRUE", T), ("FALSE OR X_Missing = 1", U),
    ("X_Missing = 1 OR X_Missing = 2", U), ("X_Missing = 1 AND X_Missing = 2", U),
    ("NOT (X_Missing = 1 OR FALSE)", U), ("NOT (X_Missing = 1 AND FALSE)", T),
    ("NOT TRUE", F), ("NOT FALSE", T), ("NOT NOT TRUE", T),
    # --- AND / OR / NOT precedence
    ("TRUE OR TRUE AND FALSE", T), ("(TRUE OR TRUE) AND FALSE", F),
    ("NOT TRUE OR TRUE", T), ("NOT (TRUE OR TRUE)", F), ("NOT FALSE AND FALSE", F),
    ("FALSE AND FALSE OR TRUE", T), ("FALSE AND (FALSE OR TRUE)", F),
    ("X_Region = 'emea' AND Priority < 5", T), ("X_Region = 'emea' AND Priority > 5", F),
    ("X_Region = 'apac' OR Priority = 3", T), ("x_region = 'emea' and not priority = 4", T),
    # --- BETWEEN
    ("X_Qty BETWEEN 50 AND 150", T), ("X_Qty BETWEEN 100 AND 100", T),
    ("X_Qty BETWEEN 101 AND 200", F), ("X_Qty NOT BETWEEN 101 AND 200", T),
    ("X_Qty NOT BETWEEN 50 AND 150", F), ("X_Price BETWEEN 24 AND 25", T),
    ("X_Qty BETWEEN 150 AND 50", F), ("X_Missing BETWEEN 1 AND 2", U),
    ("X_Missing NOT BETWEEN 1 AND 2", U), ("X_Region BETWEEN 1 AND 2", F),
    ("X_Qty BETWEEN 1 AND X_Missing", U), ("X_Qty BETWEEN 200 AND X_Missing", F),
    ("X_Qty BETWEEN 10 * 5 AND 2 * 100", T),
    ("X_Qty BETWEEN 1 AND 2 OR TRUE", T), ("X_Qty BETWEEN 1 AND 200 AND FALSE", F),
    # NOT BETWEEN is x < a OR x > b (JMS 1.1): FALSE for a string, UNKNOWN only via NULL
    ("X_Region NOT BETWEEN 2 AND 4", F), ("X_Qty NOT BETWEEN X_Missing AND 50", T),
    ("X_Qty NOT BETWEEN X_Missing AND 200", U),
    # --- exact literals as Java writes them: octal, hexadecimal, the long suffix
    ("X_Qty = 0144", T), ("X_Qty = 0x64", T), ("X_Qty = 0X64", T), ("X_Qty = 100L", T),
    ("X_Qty = 0x64l", T), ("X_Qty = 010", F), ("010 = 8", T), ("0 = 0", T),
    ("X_Qty > 0x1F", T), ("X_Qty BETWEEN 0x1 AND 0144L", T),
    # --- IN
    ("X_Region IN ('emea', 'apac')", T), ("X_Region IN ('apac', 'amer')", F),
    ("X_Region NOT IN ('apac', 'amer')", T), ("X_Region NOT IN ('emea')", F),
    ("X_Region IN ('EMEA')", F), ("X_Missing IN ('a')", U), ("X_Missing NOT IN ('a')", U),
    ("X_Code IN ('007', '008')", T), ("X_Code IN ('7')", F), ("X_Quote IN ('it''s')", T),
    ("X_Empty IN ('')", T), ("x_region in ('emea')", T),
    # --- LIKE
    ("X_Region LIKE 'emea'", T), ("X_Region LIKE 'em%'", T), ("X_Region LIKE '%ea'", T),
    ("X_Region LIKE '%m%'", T), ("X_Region LIKE 'e_ea'", T), ("X_Region LIKE 'e__a'", T),
    ("X_Region LIKE '_'", F), ("X_Region LIKE '____'", T), ("X_Region LIKE '_____'", F),
    ("X_Region LIKE 'EM%'", F), ("X_Region LIKE '%'", T), ("X_Empty LIKE '%'", T),
    ("X_Empty LIKE '_%'", F), ("X_Region NOT LIKE 'em%'", F), ("X_Region NOT LIKE 'ap%'", T),
    ("X_Missing LIKE '%'", U), ("X_Missing NOT LIKE '%'", U),
    ("X_Pct LIKE '50\\%' ESCAPE '\\'", T), ("X_Pct LIKE '5\\%' ESCAPE '\\'", F),
    ("X_Pct LIKE '%!%' ESCAPE '!'", T), ("X_Under LIKE 'a!_b' ESCAPE '!'", T),
    ("X_Under LIKE 'a!_%' ESCAPE '!'", T), ("X_Region LIKE 'e!_ea' ESCAPE '!'", F),
    ("X_Under LIKE 'a__' ESCAPE '!'", T), ("X_Under LIKE 'a_b'", T),
    ("X_Region LIKE 'em!%' ESCAPE '!'", F), ("X_Quote LIKE 'it''%'", T),
    ("Topic LIKE '/stocks/%'", T), ("Topic LIKE '/bonds/%'", F),
    ("X_Code LIKE '00%'", T), ("X_Spaced LIKE 'new %'", T),
    ("X_Region LIKE '%a%a%a%a%a%a%a%a%b'", F),
    ("X_Region LIKE 'emea' OR X_Region LIKE 'x'", T),
    # --- identifiers as conditions: only booleans are
    ("X_Region", U), ("X_Missing", U), ("NOT X_Region", U),
]

ERRORS: list[tuple[str, int]] = [
    ("", 1), ("   ", 1), ("X_Region =", 11), ("= 1", 1), ("X_Region = 'emea", 12),
    ("(X_Region = 'emea'", 19), ("X_Region = 'emea')", 18), ("X_Region == 'emea'", 11),
    ("1 +", 4), ("AND", 1), ("X_Region AND", 13), ("NOT", 4), ("a IS", 5),
    ("a IS NOT", 9), ("a BETWEEN 1", 12), ("a BETWEEN 1 OR 2", 13), ("a IN ()", 7),
    ("a IN ('x',)", 11), ("a IN (1, 2)", 7), ("a LIKE", 7), ("a LIKE 5", 8),
    ("a LIKE 'x' ESCAPE", 18), ("a LIKE 'x' ESCAPE 'ab'", 19), ("a LIKE 'x!' ESCAPE '!'", 8),
    ("a # 1", 3), ("a = 1 ;", 7), ("1 + 2", 1), ("'a'", 1), ("5", 1),
    ("'a' < 'b'", 1), ("a > 'b'", 5), ("TRUE < 1", 1), ("'a' = 1", 5), ("TRUE = 1", 6),
    ("'a' + 1 = 2", 1), ("-'a' = 1", 1), ("a BETWEEN 'x' AND 'y'", 11),
    ("NOT 5", 5), ("TRUE AND 5", 10), ("null = 1", 1), ("a = NULL", 5),
    ("TRUE AND or", 10), ("x.y = 1", 2), ("a = 1 2", 7), ("Created > '2026'", 11),
    ("1 IN ('a')", 1), ("'a' LIKE 'a'", 1), ("a + 1 IS NULL", 1),
    ("a = 09", 5), ("a = 0x", 6), ("a = 1LL", 7),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_jms_case(text: str, expected: bool | None) -> None:
    selector = compile_selector("JMS", text)
    assert selector.evaluate(VIEW) is expected, text
    assert selector.matches(VIEW) is (expected is True)


@pytest.mark.parametrize(("text", "column"), ERRORS)
def test_jms_error(text: str, column: int) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector("JMS", text)
    assert caught.value.code == 567
    assert caught.value.column == column, caught.value.text
    assert caught.value.text.startswith("Incorrect message selector (")
    assert caught.value.text.endswith(f"at column {column})")


def test_enough_cases() -> None:
    assert len(CASES) + len(ERRORS) >= 150


@pytest.mark.parametrize("cls", ["XPATH", "SQL", "", "JMS2"])
def test_unsupported_class(cls: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(cls, "a = 1")
    assert caught.value.code == 566
    assert caught.value.text == "Unsupported selector class"


def test_class_names_case_insensitive() -> None:
    assert compile_selector("jms", "TRUE").cls == "JMS"


def test_compiled_once() -> None:
    assert compile_selector("JMS", "X_Qty > 1") is compile_selector("JMS", "  X_Qty > 1 ")


def test_length_and_depth_bounded(settings) -> None:
    settings.SMQP_SELECTOR_MAX_LENGTH = 50
    with pytest.raises(SelectorError) as caught:
        compile_selector("JMS", "X_Qty = 1 OR " * 10 + "TRUE")
    assert caught.value.code == 567 and "longer than 50" in caught.value.text
    settings.SMQP_SELECTOR_MAX_LENGTH = 10_000
    settings.SMQP_SELECTOR_MAX_DEPTH = 64
    with pytest.raises(SelectorError) as caught:
        compile_selector("JMS", "NOT " * 100 + "TRUE")
    assert "nested deeper" in caught.value.text
    # Long flat chains and deep parentheses are not nesting.
    assert compile_selector("JMS", " OR ".join(["X_Qty = 1"] * 300)).evaluate(VIEW) is False
    assert compile_selector("JMS", "(" * 500 + "TRUE" + ")" * 500).matches(VIEW)


def test_like_is_linear_in_the_text_and_header_values_are_capped(settings) -> None:
    """Issue 34 item 2: the pattern that took seconds per message in the old wildcard
    matcher still answers right; selectors read at most SMQP_SELECTOR_MAX_VALUE_CHARS."""
    pattern = "X_A LIKE '%" + "a" * 990 + "b'"
    selector = compile_selector("JMS", pattern)
    assert selector.evaluate(message_view(topic="/t", headers=[("X-A", "a" * 4000)])) is False
    assert selector.evaluate(message_view(topic="/t", headers=[("X-A", "a" * 3000 + "b")]))
    settings.SMQP_SELECTOR_MAX_VALUE_CHARS = 2000
    long = message_view(topic="/t", headers=[("X-A", "x" * 2500 + "b")])
    assert compile_selector("JMS", "X_A LIKE 'x%'").evaluate(long) is True
    assert compile_selector("JMS", "X_A LIKE '%b'").evaluate(long) is False  # past the cap
    assert compile_selector("JMS", "X_A = 'x'").evaluate(long) is False
    for text, like, expected in [("a\nb", "a_b", True), ("a.b", "a.b", True),
                                 ("axb", "a.b", False), ("(x)", "(%)", True),
                                 ("\u00e9", "_", True), ("\U0001F600", "__", False),
                                 ("\ud800", "_", True)]:
        view = message_view(topic="/t", headers=[("X-A", text)])
        assert compile_selector("JMS", f"X_A LIKE '{like}'").evaluate(view) is expected, like


def test_like_is_linear_on_hostile_patterns() -> None:
    # A backtracking regex takes exponential time here; the wildcard matcher does not.
    text = "a" * 3000
    view = message_view(topic="/t", headers=[("X-A", text)])
    selector = compile_selector("JMS", "X_A LIKE '" + "%a" * 40 + "%b'")
    assert selector.evaluate(view) is False
