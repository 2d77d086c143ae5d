"""The ``JMS`` selector class: the SQL-92 subset of JMS 1.1 §3.8.

Parsed by a lark LALR grammar (below), then compiled once into nested Python closures (no
``eval``, no regex): each evaluation is a few function calls. Three-valued logic: ``None``
is UNKNOWN. JMS 1.1 rules kept here:

* Comparing values of different types (a string with a number, a boolean with a string) is
  FALSE, not UNKNOWN; a NULL operand makes it UNKNOWN. Strings and booleans compare with
  ``=`` and ``<>`` only (a literal string on either side of ``<`` is a type error, 567).
* Arithmetic on NULL or a non-number is UNKNOWN; exact numbers divide as Java's ``long``
  (truncating toward zero), a division by zero is UNKNOWN.
* ``IN`` and ``LIKE`` take an identifier and string literals, and match the header's text
  (also when it parses as a number: ``X_Code IN ('007')``). ``x BETWEEN a AND b`` is
  ``x >= a AND x <= b``, ``x NOT BETWEEN a AND b`` is ``x < a OR x > b`` (FALSE for a
  string, as JMS 1.1 writes it, not the negation of BETWEEN's FALSE).
* Exact literals are Java's: ``0x1F`` hexadecimal, ``010`` octal (8, as ActiveMQ reads
  it), an ``L`` suffix allowed.
* Identifiers are case-insensitive (profile §9.2) and may not be reserved words.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lark import Lark, Token, Tree

from .errors import SelectorError, incorrect, parse
from .like import compile_like
from .view import MessageView, identifier_key

GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: NOT not_expr -> not_
         | predicate

?predicate: sum COMPOP sum                       -> compare
          | sum NOT? _BETWEEN sum _AND sum       -> between
          | sum NOT? _IN "(" string ("," string)* ")"  -> in_
          | sum NOT? _LIKE string (_ESCAPE string)?  -> like
          | sum _IS NOT? _NULL                   -> is_null
          | sum

?sum: product (ADDOP product)*
?product: unary (MULOP unary)*
?unary: ADDOP unary -> sign
      | atom
?atom: EXACT         -> exact
     | APPROX        -> approx
     | string
     | _TRUE         -> true
     | _FALSE        -> false
     | IDENT         -> ident
     | "(" or_expr ")"

string: STRING

COMPOP: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
STRING: /'(?:[^']|'')*'/
APPROX: /(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+/
EXACT: /0[xX][0-9a-fA-F]+[lL]?|\d+[lL]?/
IDENT: /[^\W\d][\w$]*|\$[\w$]*/

_OR: "OR"i
_AND: "AND"i
NOT: "NOT"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_LIKE: "LIKE"i
_ESCAPE: "ESCAPE"i
_IS: "IS"i
_NULL: "NULL"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i

%ignore /[ \t\r\n\f]+/
"""


@functools.cache
def _parser() -> Lark:
    """Built on first use: every process loads this module (django.setup), few parse."""
    return Lark(GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True)


#: Words JMS 1.1 forbids as identifiers (the lexer makes most of them keywords already).
RESERVED = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN",
                      "IS", "ESCAPE"})

Fn = Callable[[MessageView], Any]
# Static kinds of a compiled node: what a type check can know before any message.
BOOL, NUM, STR, ANY = "bool", "num", "str", "any"


def compile_jms(text: str, max_depth: int) -> Fn:
    """The evaluator of a JMS selector: view → True / False / None (UNKNOWN)."""
    tree = parse(_parser(), text, max_depth)
    kind, fn = _compile(tree)
    if kind not in (BOOL, ANY):
        raise incorrect("not a condition", _column(tree))
    if kind == ANY:
        inner = fn
        return lambda v: _as_bool(inner(v))
    return fn


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _column(node: Tree | Token) -> int:
    if isinstance(node, Token):
        return node.column or 1
    return getattr(node.meta, "column", 1) or 1


def _string_literal(node: Tree) -> str:
    token = node.children[0]
    return token.value[1:-1].replace("''", "'")


def _compile(node: Tree | Token) -> tuple[str, Fn]:
    # Recursion is bounded: check_depth() refused deeper trees before this runs.
    rule = node.data if isinstance(node, Tree) else None
    handler = _RULES.get(rule)
    if handler is None:  # pragma: no cover - every rule of the grammar has a handler
        raise incorrect("unsupported expression", _column(node))
    return handler(node)


def _exact_value(token: Token) -> int:
    """An exact literal as Java (and ActiveMQ) reads it: ``0x1F`` hexadecimal, ``010`` octal
    (8), ``7L`` with the long suffix; 567 for an octal literal with an 8 or a 9."""
    text = token.value.rstrip("lL")
    if text[:2] in ("0x", "0X"):
        return int(text[2:], 16)
    if len(text) > 1 and text[0] == "0":
        try:
            return int(text, 8)
        except ValueError:
            raise incorrect(f"{token.value} is not an octal number", _column(token)) from None
    return int(text)


def _c_exact(node: Tree) -> tuple[str, Fn]:
    value = _exact_value(node.children[0])
    return NUM, lambda v: value


def _c_approx(node: Tree) -> tuple[str, Fn]:
    value = float(node.children[0].value)
    return NUM, lambda v: value


def _c_string(node: Tree) -> tuple[str, Fn]:
    value = _string_literal(node)
    return STR, lambda v: value


def _c_true(node: Tree) -> tuple[str, Fn]:
    return BOOL, lambda v: True


def _c_false(node: Tree) -> tuple[str, Fn]:
    return BOOL, lambda v: False


def _ident_key(node: Tree | Token) -> str:
    """The view key of an identifier node (IN, LIKE and IS NULL take only an identifier;
    the grammar accepts any operand there so that LALR need not guess early)."""
    if isinstance(node, Tree) and node.data == "ident":
        node = node.children[0]
    if not isinstance(node, Token) or node.type != "IDENT":
        raise incorrect("an identifier is needed here", _column(node))
    if node.value.upper() in RESERVED:
        raise incorrect(f"reserved word {node.value!r}", _column(node))
    return identifier_key(node.value)


def _c_ident(node: Tree) -> tuple[str, Fn]:
    key = _ident_key(node.children[0])

    def ident(v: MessageView) -> Any:
        return v.value(key)

    return ANY, ident


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _c_sign(node: Tree) -> tuple[str, Fn]:
    op, operand = node.children
    kind, fn = _compile(operand)
    if kind not in (NUM, ANY):
        raise incorrect("a sign needs a number", _column(op))
    if op.value == "+":
        return NUM, lambda v: (x if _is_num(x := fn(v)) else None)
    return NUM, lambda v: (-x if _is_num(x := fn(v)) else None)


def _divide(a: int | float, b: int | float) -> int | float | None:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)  # Java long division: truncated toward zero
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _divide,
}


def _c_arith(node: Tree) -> tuple[str, Fn]:
    children = node.children
    first_kind, acc = _compile(children[0])
    if first_kind not in (NUM, ANY):
        raise incorrect("arithmetic needs numbers", _column(children[0]))
    for i in range(1, len(children), 2):
        op, right = children[i], children[i + 1]
        kind, fn = _compile(right)
        if kind not in (NUM, ANY):
            raise incorrect("arithmetic needs numbers", _column(right))
        acc = _arith_step(acc, _ARITH[op.value], fn)
    return NUM, acc


def _arith_step(left: Fn, op: Callable[[Any, Any], Any], right: Fn) -> Fn:
    def step(v: MessageView) -> Any:
        a = left(v)
        if not _is_num(a):
            return None
        b = right(v)
        if not _is_num(b):
            return None
        try:
            return op(a, b)
        except (OverflowError, ValueError):
            return None

    return step


def _ordering(op: str) -> Callable[[Any, Any], bool]:
    return {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}[op]


def _compare_values(op: str, a: Any, b: Any) -> bool | None:
    """JMS comparison of two runtime values (None: NULL)."""
    if a is None or b is None:
        return None
    a_num, b_num = _is_num(a), _is_num(b)
    if a_num and b_num:
        if op == "=":
            return a == b
        if op == "<>":
            return a != b
        return _ordering(op)(a, b)
    if type(a) is not type(b):
        return False  # unlike types: FALSE (JMS 1.1 §3.8.1.2)
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    return False  # strings and booleans have no order in JMS


def _c_compare(node: Tree) -> tuple[str, Fn]:
    left, op_token, right = node.children
    op = op_token.value
    lk, lf = _compile(left)
    rk, rf = _compile(right)
    if op not in ("=", "<>"):
        for kind, side in ((lk, left), (rk, right)):
            if kind in (STR, BOOL):
                raise incorrect(f"{op} cannot compare a {kind}", _column(side))
    if ANY not in (lk, rk) and lk != rk:
        raise incorrect(f"cannot compare a {lk} with a {rk}", _column(op_token))
    fast = _identifier_against_literal(left, op, right)
    if fast is not None:
        return BOOL, fast

    def compare(v: MessageView) -> bool | None:
        return _compare_values(op, lf(v), rf(v))

    return BOOL, compare


def _identifier_against_literal(left: Tree | Token, op: str, right: Tree | Token) -> Fn | None:
    """The common ``Header = 'text'`` / ``Header > 5`` as one closure (the same result as
    :func:`_compare_values`, without its calls): most selectors are made of these."""
    if not (isinstance(left, Tree) and left.data == "ident" and isinstance(right, Tree)
            and right.data in ("string", "exact", "approx")):
        return None
    key = _ident_key(left.children[0])
    if right.data == "string":
        if op not in ("=", "<>"):
            return None
        literal = _string_literal(right)
        equal = op == "="

        def str_compare(v: MessageView) -> bool | None:
            x = v.value(key)
            if x is None:
                return None
            if type(x) is not str:
                return False
            return (x == literal) is equal

        return str_compare
    number: int | float = (_exact_value(right.children[0]) if right.data == "exact"
                           else float(right.children[0].value))
    test = {"=": lambda x: x == number, "<>": lambda x: x != number,
            "<": lambda x: x < number, "<=": lambda x: x <= number,
            ">": lambda x: x > number, ">=": lambda x: x >= number}[op]

    def num_compare(v: MessageView) -> bool | None:
        x = v.value(key)
        if x is None:
            return None
        if type(x) is str or type(x) is bool:
            return False
        return test(x)

    return num_compare


def _c_between(node: Tree) -> tuple[str, Fn]:
    children = list(node.children)
    negate = isinstance(children[1], Token) and children[1].type == "NOT"
    if negate:
        children.pop(1)
    value, low, high = children
    fns = []
    for part in (value, low, high):
        kind, fn = _compile(part)
        if kind not in (NUM, ANY):
            raise incorrect("BETWEEN needs numbers", _column(part))
        fns.append(fn)
    vf, lf, hf = fns

    def between(v: MessageView) -> bool | None:
        x = vf(v)
        if negate:  # JMS 1.1: x < a OR x > b (FALSE for a string, not NOT FALSE)
            return _or(_compare_values("<", x, lf(v)), _compare_values(">", x, hf(v)))
        return _and(_compare_values(">=", x, lf(v)), _compare_values("<=", x, hf(v)))

    return BOOL, between


def _c_in(node: Tree) -> tuple[str, Fn]:
    children = list(node.children)
    key = _ident_key(children.pop(0))
    negate = isinstance(children[0], Token) and children[0].type == "NOT"
    if negate:
        children.pop(0)
    options = frozenset(_string_literal(c) for c in children)

    def in_(v: MessageView) -> bool | None:
        x = v.text(key)
        if x is None:
            return None
        return (x not in options) if negate else (x in options)

    return BOOL, in_


def _c_like(node: Tree) -> tuple[str, Fn]:
    children = list(node.children)
    key = _ident_key(children.pop(0))
    negate = isinstance(children[0], Token) and children[0].type == "NOT"
    if negate:
        children.pop(0)
    pattern = _string_literal(children[0])
    escape = None
    if len(children) > 1:
        escape = _string_literal(children[1])
        if len(escape) != 1:
            raise incorrect("ESCAPE takes one character", _column(children[1]))
    try:
        matcher = compile_like(pattern, escape)
    except ValueError as exc:
        raise incorrect(str(exc), _column(children[0])) from None

    def like(v: MessageView) -> bool | None:
        x = v.text(key)
        if x is None:
            return None
        result = matcher(x)
        return (not result) if negate else result

    return BOOL, like


def _c_is_null(node: Tree) -> tuple[str, Fn]:
    children = list(node.children)
    key = _ident_key(children[0])
    negate = len(children) > 1

    def is_null(v: MessageView) -> bool:
        return (key in v) if negate else (key not in v)

    return BOOL, is_null


def _not(x: bool | None) -> bool | None:
    return None if x is None else not x


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _condition(node: Tree | Token) -> Fn:
    kind, fn = _compile(node)
    if kind == BOOL:
        return fn
    if kind == ANY:
        return lambda v: _as_bool(fn(v))
    raise incorrect("not a condition", _column(node))


def _c_not(node: Tree) -> tuple[str, Fn]:
    fn = _condition(node.children[1])

    def not_(v: MessageView) -> bool | None:
        x = fn(v)
        return None if x is None else not x

    return BOOL, not_


def _c_and(node: Tree) -> tuple[str, Fn]:
    fns = [_condition(c) for c in node.children]

    def and_(v: MessageView) -> bool | None:
        unknown = False
        for fn in fns:  # FALSE wins over UNKNOWN; stop at the first FALSE
            x = fn(v)
            if x is False:
                return False
            if x is None:
                unknown = True
        return None if unknown else True

    return BOOL, and_


def _c_or(node: Tree) -> tuple[str, Fn]:
    fns = [_condition(c) for c in node.children]

    def or_(v: MessageView) -> bool | None:
        unknown = False
        for fn in fns:  # TRUE wins over UNKNOWN; stop at the first TRUE
            x = fn(v)
            if x is True:
                return True
            if x is None:
                unknown = True
        return None if unknown else False

    return BOOL, or_


_RULES: dict[str | None, Callable[[Any], tuple[str, Fn]]] = {
    "exact": _c_exact,
    "approx": _c_approx,
    "string": _c_string,
    "true": _c_true,
    "false": _c_false,
    "ident": _c_ident,
    "sign": _c_sign,
    "sum": _c_arith,
    "product": _c_arith,
    "compare": _c_compare,
    "between": _c_between,
    "in_": _c_in,
    "like": _c_like,
    "is_null": _c_is_null,
    "not_": _c_not,
    "and_expr": _c_and,
    "or_expr": _c_or,
}

__all__ = ["GRAMMAR", "SelectorError", "compile_jms", "parse"]
