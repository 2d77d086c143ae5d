"""Selector refusals (profile §9.2): 566 unsupported class, 567 incorrect selector (with the
column, 1-based, in the selector text), and the nesting bound."""

from __future__ import annotations

from collections.abc import Callable

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .. import Refusal, ServiceError

UNSUPPORTED = Refusal.UNSUPPORTED_SELECTOR.smqp
INCORRECT = Refusal.INCORRECT_SELECTOR.smqp
NO_SUCH_SUBSCRIPTION = Refusal.NO_SUCH_SUBSCRIPTION.smqp


class SelectorError(ServiceError):
    """A selector refused: ``code`` 566 or 567, ``what`` went wrong, at ``column`` (567;
    1-based in the selector text, None for 566). Doors render it as they like; SMQP sends
    ``text`` as is (``567 Incorrect message selector (unexpected ')' at column 7)``)."""

    def __init__(self, code: int, what: str, column: int | None = None) -> None:
        refusal = Refusal.of(code)
        if refusal is Refusal.UNSUPPORTED_SELECTOR:
            text = refusal.text()
        else:
            where = f" at column {column}" if column is not None else ""
            text = refusal.text(f"{what}{where}")
        super().__init__(refusal, text)
        self.what = what
        self.column = column

    def __reduce__(self) -> tuple:
        return (type(self), (self.code, self.what, self.column))


def unsupported(cls: str) -> SelectorError:
    return SelectorError(UNSUPPORTED, f"unsupported selector class {cls!r}")


def incorrect(what: str, column: int | None) -> SelectorError:
    return SelectorError(INCORRECT, what, column)


def check_depth(tree: Tree, max_depth: int) -> None:
    """Refuse a parse tree nested deeper than ``max_depth`` (walked with a stack of its
    own, so that a deep tree cannot exhaust Python's): the evaluators recurse once per
    level. Flat chains (``a OR b OR c``, ``a + b + c``, ``(&(a=1)(b=2)...)``) are one level."""
    stack: list[tuple[Tree | Token, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Tree):
            continue
        if depth > max_depth:
            column = getattr(node.meta, "column", None) if hasattr(node, "meta") else None
            raise incorrect(f"nested deeper than {max_depth} levels", column or 1)
        stack.extend((child, depth + 1) for child in node.children)


def shown(value: str, most: int = 24) -> str:
    """A piece of the selector quoted in an error reply: short, escapes visible."""
    return repr(value if len(value) <= most else value[:most] + "...")


def parse(parser: Lark, text: str, max_depth: int,
          refine: Callable[[UnexpectedInput, str], SelectorError | None] | None = None) -> Tree:
    """Parse with one class's grammar; a syntax error is a 567 at its column (``refine`` may
    name a class's own mistakes more precisely), and the tree's nesting is bounded."""
    try:
        tree = parser.parse(text)
    except UnexpectedInput as exc:
        raise (refine(exc, text) if refine else None) or syntax_error(exc, text) from None
    check_depth(tree, max_depth)
    return tree


def syntax_error(exc: UnexpectedInput, text: str) -> SelectorError:
    if isinstance(exc, UnexpectedCharacters):
        return incorrect(f"unexpected character {text[exc.pos_in_stream]!r}", exc.column)
    if isinstance(exc, UnexpectedToken):
        if exc.token.type == "$END":
            return incorrect("unexpected end", len(text) + 1)
        return incorrect(f"unexpected {shown(exc.token.value)}", exc.column)
    if isinstance(exc, UnexpectedEOF):
        return incorrect("unexpected end", len(text) + 1)
    return incorrect("syntax error", getattr(exc, "column", 1) or 1)
