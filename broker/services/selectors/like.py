"""JMS ``LIKE`` patterns: ``_`` one character, ``%`` any sequence, an optional escape.

Matched by RE2 (``google-re2``): its automata run in time linear in the text whatever the
pattern, so no pattern a subscriber writes can make one message cost more than a pass over
its (capped) header value. The pure-Python wildcard matcher this replaced was
O(pattern * text): ``'%aaa…ab'`` against 4,000 ``a`` took seconds per selector; Python's
``re`` backtracks exponentially on such patterns. Each literal character is written as
``\\x{…}``, so nothing in the user's pattern is read as RE2 syntax.
"""

from __future__ import annotations

from collections.abc import Callable

import re2

ANY_ONE = object()
ANY_SEQ = object()

_OPTIONS = re2.Options()
_OPTIONS.dot_nl = True  # ``_`` and ``%`` match line breaks too
_OPTIONS.never_capture = True
_OPTIONS.log_errors = False


def tokens(pattern: str, escape: str | None) -> list[object]:
    """The pattern as a list of literal characters, ANY_ONE and ANY_SEQ (runs of ``%``
    folded into one). ValueError for an escape character that ends the pattern."""
    out: list[object] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 >= len(pattern):
                raise ValueError("escape character at the end of the pattern")
            out.append(pattern[i + 1])
            i += 2
            continue
        if ch == "%":
            if not out or out[-1] is not ANY_SEQ:
                out.append(ANY_SEQ)
        elif ch == "_":
            out.append(ANY_ONE)
        else:
            out.append(ch)
        i += 1
    return out


def _literal(ch: str) -> str:
    if ch.isascii() and ch.isalnum():
        return ch
    return "\\x{%x}" % (0xFFFD if 0xD800 <= ord(ch) <= 0xDFFF else ord(ch))


def _regex(toks: list[object]) -> str:
    parts = []
    for t in toks:
        if t is ANY_SEQ:
            parts.append(".*")
        elif t is ANY_ONE:
            parts.append(".")
        else:
            parts.append(_literal(t))  # type: ignore[arg-type]
    return "".join(parts)


def _utf8_safe(text: str) -> str:
    """RE2 reads UTF-8: a lone surrogate (no UTF-8 form) is read as U+FFFD, one character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def compile_like(pattern: str, escape: str | None) -> Callable[[str], bool]:
    toks = tokens(pattern, escape)
    if not any(t is ANY_ONE or t is ANY_SEQ for t in toks):
        literal = "".join(toks)  # type: ignore[arg-type]
        return lambda text: text == literal
    if len(toks) >= 1 and toks[-1] is ANY_SEQ and all(isinstance(t, str) for t in toks[:-1]):
        prefix = "".join(toks[:-1])  # type: ignore[arg-type]
        return lambda text: text.startswith(prefix)
    compiled = re2.compile(_regex(toks), _OPTIONS)

    def like(text: str) -> bool:
        return compiled.fullmatch(_utf8_safe(text)) is not None

    return like
