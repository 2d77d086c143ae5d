"""The one error of the broker's value grammar and of every codec built on it."""

from __future__ import annotations

__all__ = ["ProtocolError", "bad_request"]


class ProtocolError(Exception):
    """Malformed input: a value that does not parse, or a malformed command.

    ``code`` is the reply code to send (400 unless stated, 414 for over-size input) and
    ``text`` the full reply text, e.g. ``"Bad request (line too long)"``; ``str(e)`` is the
    reply line without its CRLF. Instances compare equal when code and text are equal, so
    parsed event streams can be compared in tests.
    """

    def __init__(self, code: int = 400, text: str = "Bad request") -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text

    def __str__(self) -> str:
        return f"{self.code} {self.text}"

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.text!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProtocolError):
            return NotImplemented
        return self.code == other.code and self.text == other.text

    def __hash__(self) -> int:
        return hash((self.code, self.text))


def bad_request(reason: str) -> ProtocolError:
    """Return ``ProtocolError(400, "Bad request (<reason>)")``."""
    return ProtocolError(400, f"Bad request ({reason})")
