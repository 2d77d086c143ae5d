"""The ``RFC-2254`` (``LDAP``) selector class: LDAP search filters in the string form of
RFC 4515, evaluated as RFC 4511 §4.5.1.7 says: an item on an attribute the message lacks is
FALSE (Undefined is for an unrecognised attribute or a matching rule that does not apply,
and every header name is recognised, with every rule), so ``(!(x-n>=7))`` selects a message
without ``X-N``; ``&`` / ``|`` / ``!`` keep three values all the same.

Parsed by a lark LALR grammar with a contextual lexer (after ``=`` a value is read, not an
attribute name), compiled once into closures. Matching rules, per the profile (§9.2):

* equality, ``>=``, ``<=``: numerically when both the header and the assertion are numbers;
  otherwise caseIgnoreMatch / caseIgnoreOrderingMatch (case-folded, runs of spaces as one,
  leading and trailing spaces ignored).
* ``~=`` (approximate, implementation-defined by RFC 4511): equal once case-folded with
  every character that is not a letter or digit removed.
* substrings (``a=in*any*fin``): caseIgnoreSubstringsMatch on the header's text; spaces
  inside the pieces are significant (RFC 4518 §2.6.1: runs of them count as one, and
  ``*em *ea`` does not match ``EMEA``).
* presence (``a=*``): TRUE when the message has the header, FALSE otherwise.
* extensible matches (``a:dn:=v``) are not supported (567).

Attribute names are written as the header is (``x-region``), case-insensitive; ``_`` is
accepted for ``-``. A filter without its outer parentheses (``x-region=emea``) is accepted
as a convenience.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from .errors import SelectorError, incorrect, parse
from .view import MessageView, identifier_key, parse_number

GRAMMAR = r"""
start: filter | item

filter: "(" filtercomp ")"
?filtercomp: and_ | or_ | not_ | item
and_: "&" filter+
or_: "|" filter+
not_: "!" filter

item: ATTR EQ (VALUE | STAR)*  -> equal_or_substring
    | ATTR APPROX VALUE?       -> approx
    | ATTR GE VALUE?           -> ge
    | ATTR LE VALUE?           -> le

ATTR: /[A-Za-z][A-Za-z0-9_-]*/
EQ: "="
APPROX: "~="
GE: ">="
LE: "<="
STAR: "*"
VALUE: /(?:[^()*\\\x00]|\\[0-9a-fA-F]{2})+/
"""


@functools.cache
def _parser() -> Lark:
    """Built on first use: every process loads this module (django.setup), few parse."""
    return Lark(GRAMMAR, parser="lalr", lexer="contextual", propagate_positions=True)


Fn = Callable[[MessageView], Any]
_ESCAPE = re.compile(r"\\([0-9a-fA-F]{2})")  # a fixed pattern: RFC 4515 \XX escapes
_SPACES = re.compile(r"\s+")
_NOT_ALNUM = re.compile(r"[\W_]+")


def _ldap_mistake(exc: UnexpectedInput, text: str) -> SelectorError | None:
    """What RFC 4515 allows and this profile does not, or a broken escape, named as such."""
    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream]
        if ch == ":":
            return incorrect("extensible match not supported", exc.column)
        if ch == "\\":
            return incorrect("bad escape (\\ takes two hex digits)", exc.column)
    elif (isinstance(exc, UnexpectedToken) and exc.token.type != "$END"
          and str(exc.token.value).startswith(":")):
        return incorrect("extensible match not supported", exc.column)
    return None


def compile_ldap(text: str, max_depth: int) -> Fn:
    """The evaluator of an LDAP filter: view → True / False / None (Undefined)."""
    tree = parse(_parser(), text, max_depth, _ldap_mistake)
    return _compile(tree.children[0])


def _column(node: Tree | Token) -> int:
    if isinstance(node, Token):
        return node.column or 1
    return getattr(node.meta, "column", 1) or 1


def _decode(token: Token | None) -> str:
    """An assertion value with its ``\\XX`` escapes (UTF-8 bytes) decoded."""
    if token is None:
        return ""
    raw = token.value
    if "\\" not in raw:
        return raw
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(raw):
        out += raw[pos:m.start()].encode()
        out.append(int(m.group(1), 16))
        pos = m.end()
    out += raw[pos:].encode()
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise incorrect("escapes are not UTF-8", _column(token)) from None


def _fold(text: str) -> str:
    return _SPACES.sub(" ", text).strip().casefold()


def _fold_piece(text: str) -> str:
    """A substring piece folded as the value, but its spaces at either end kept."""
    return _SPACES.sub(" ", text).casefold()


def _compile(node: Tree) -> Fn:
    # Recursion is bounded: check_depth() refused deeper trees before this runs.
    rule = node.data
    if rule == "filter":
        return _compile(node.children[0])
    if rule == "and_":
        return _c_and([_compile(c) for c in node.children])
    if rule == "or_":
        return _c_or([_compile(c) for c in node.children])
    if rule == "not_":
        inner = _compile(node.children[0])
        return lambda v: (None if (x := inner(v)) is None else not x)
    if rule == "equal_or_substring":
        return _c_equal_or_substring(node)
    if rule in ("approx", "ge", "le"):
        return _c_simple(rule, node)
    raise incorrect("unsupported filter", _column(node))  # pragma: no cover


def _c_and(fns: list[Fn]) -> Fn:
    def and_(v: MessageView) -> bool | None:
        unknown = False
        for fn in fns:
            x = fn(v)
            if x is False:
                return False
            if x is None:
                unknown = True
        return None if unknown else True

    return and_


def _c_or(fns: list[Fn]) -> Fn:
    def or_(v: MessageView) -> bool | None:
        unknown = False
        for fn in fns:
            x = fn(v)
            if x is True:
                return True
            if x is None:
                unknown = True
        return None if unknown else False

    return or_


def _c_equal_or_substring(node: Tree) -> Fn:
    attr, _eq, *parts = node.children
    key = identifier_key(attr.value)
    stars = [p for p in parts if p.type == "STAR"]
    if not stars:
        return _equality(key, _decode(parts[0] if parts else None))
    if len(parts) == 1:
        return lambda v: key in v  # presence: a=*
    for a, b in itertools.pairwise(parts):
        if a.type == "STAR" and b.type == "STAR":
            raise incorrect("empty substring between two *", _column(b))
    values = [_fold_piece(_decode(p)) if p.type == "VALUE" else None for p in parts]
    initial = values[0] if values[0] is not None else ""
    final = values[-1] if values[-1] is not None else ""
    middle = [x for x in values[1:-1] if x is not None]
    return _substrings(key, initial, middle, final)


def _substrings(key: str, initial: str, middle: list[str], final: str) -> Fn:
    def substrings(v: MessageView) -> bool | None:
        text = v.folded(key, _fold)
        if text is None:
            return False
        if not text.startswith(initial):
            return False
        pos = len(initial)
        end = len(text) - len(final)
        if end < pos or not text.endswith(final):
            return False
        for part in middle:
            found = text.find(part, pos, end)
            if found < 0:
                return False
            pos = found + len(part)
        return True

    return substrings


def _equality(key: str, assertion: str) -> Fn:
    number = parse_number(assertion)
    folded = _fold(assertion)

    def equal(v: MessageView) -> bool | None:
        if number is not None:
            value = v.value(key)
            if isinstance(value, int | float):
                return value == number
        text = v.folded(key, _fold)
        if text is None:
            return False
        return text == folded

    return equal


def _c_simple(rule: str, node: Tree) -> Fn:
    attr, _op, *rest = node.children
    key = identifier_key(attr.value)
    assertion = _decode(rest[0] if rest else None)
    if rule == "approx":
        wanted = _NOT_ALNUM.sub("", assertion).casefold()

        def approx(v: MessageView) -> bool | None:
            text = v.text(key)
            if text is None:
                return False
            return _NOT_ALNUM.sub("", text).casefold() == wanted

        return approx
    number = parse_number(assertion)
    folded = _fold(assertion)
    greater = rule == "ge"

    def order(v: MessageView) -> bool | None:
        if number is not None:
            value = v.value(key)
            if isinstance(value, int | float):
                return value >= number if greater else value <= number
        mine = v.folded(key, _fold)
        if mine is None:
            return False
        return mine >= folded if greater else mine <= folded

    return order


__all__ = ["GRAMMAR", "compile_ldap", "parse"]
