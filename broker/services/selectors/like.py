"""JMS ``LIKE`` patterns: ``_`` one character, ``%`` any sequence, an optional escape.

Matched by the classic greedy wildcard algorithm (one backtrack point): O(pattern * text)
in the worst case. A regex would do the same work but backtracks exponentially on patterns
like ``%a%a%a%a%b`` (and must not be built from user text unescaped anyway).
"""

from __future__ import annotations

from collections.abc import Callable

ANY_ONE = object()
ANY_SEQ = object()


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


def match(toks: list[object], text: str) -> bool:
    t = p = 0
    star_p = -1
    star_t = 0
    n, m = len(text), len(toks)
    while t < n:
        if p < m and toks[p] is not ANY_SEQ and (toks[p] is ANY_ONE or toks[p] == text[t]):
            t += 1
            p += 1
        elif p < m and toks[p] is ANY_SEQ:
            star_p, star_t = p, t
            p += 1
        elif star_p >= 0:
            star_t += 1
            t = star_t
            p = star_p + 1
        else:
            return False
    while p < m and toks[p] is ANY_SEQ:
        p += 1
    return p == m


def compile_like(pattern: str, escape: str | None) -> Callable[[str], bool]:
    toks = tokens(pattern, escape)
    if not any(t is ANY_ONE or t is ANY_SEQ for t in toks):
        literal = "".join(toks)  # type: ignore[arg-type]
        return lambda text: text == literal
    if len(toks) >= 1 and toks[-1] is ANY_SEQ and all(isinstance(t, str) for t in toks[:-1]):
        prefix = "".join(toks[:-1])  # type: ignore[arg-type]
        return lambda text: text.startswith(prefix)
    return lambda text: match(toks, text)
