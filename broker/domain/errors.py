"""The broker's errors: :class:`Refusal`, every way a command is refused with what each door
says for it, and :class:`ProtocolError`, the one error of the value grammar and of every
codec built on it.

The services raise :class:`broker.services.ServiceError`, which carries a :class:`Refusal`;
each door turns it into its wire form in one place from the refusal's columns (SMQP: the
code and text; XMPP: the stanza error conditions; REST: the problem's status and title;
QQP: the status digit). A new refusal is one new row here.
"""

from __future__ import annotations

import enum
from http import HTTPStatus

__all__ = ["ProtocolError", "Refusal", "bad_request"]


class Refusal(enum.Enum):
    """A refusal and its wire form at every door.

    Columns: ``smqp`` the SMQP reply code (profile §3, selectors §9.2), ``phrase`` the SMQP
    reply text before any ``(reason)``, ``http`` the REST status, ``xmpp`` the XEP-0060
    stanza error condition and ``pubsub`` its pubsub-specific one (or None), ``qqp`` the QQP
    status digit (4: not stored, try again later; 5: refused), ``xmpp_text`` how the XMPP
    error's text is made from the SMQP code and text (empty: no text).
    """

    # smqp, phrase, http, xmpp, pubsub, qqp, xmpp_text
    BAD_REQUEST = 400, "Bad request", 400, "bad-request", None, 5, "{text}"
    # SMQP's 401 is "no right" for a logged-in account: HTTP's 403 (HTTP's 401 asks for
    # credentials).
    UNAUTHORIZED = 401, "Unauthorized", 403, "forbidden", None, 5, "{text}"
    NOT_FOUND = 404, "Not found", 404, "item-not-found", None, 5, "{text}"
    # An operation refused on that kind of topic.
    NOT_ALLOWED = 405, "Not allowed", 403, "not-allowed", None, 5, "{text}"
    # 406 and 409: a state that forbids the operation.
    NOT_ACCEPTABLE = 406, "Not acceptable", 409, "bad-request", None, 5, "{text}"
    REQUEST_TIMEOUT = 408, "Request timeout", 400, "bad-request", None, 5, "{text}"
    CONFLICT = 409, "Conflict", 409, "conflict", None, 5, "{text}"
    # A size or count limit.
    TOO_LARGE = 414, "Resource too large", 413, "not-acceptable", "payload-too-big", 5, "{text}"
    # Nothing was committed. REST answers never a 500 (REST-API.md): a 400 as before, its
    # smqp_code (500) saying the fault is the server's.
    SERVER_ERROR = 500, "Server error", 400, "internal-server-error", None, 4, "{text}"
    NOT_IMPLEMENTED = 501, "Not implemented", 400, "feature-not-implemented", None, 5, "{text}"
    MAX_QUANTITY = (510, "Maximum quantity exceeded", 422, "resource-constraint", None, 4,
                    "{text}")
    # Selectors (profile §9.2). XMPP: XEP-0060 §6.3.5's options that cannot be accepted, the
    # text keeping SMQP's code (and the column).
    UNSUPPORTED_SELECTOR = (566, "Unsupported selector class", 400, "bad-request",
                            "invalid-options", 5, "{code} {text}")
    INCORRECT_SELECTOR = (567, "Incorrect message selector", 400, "bad-request",
                          "invalid-options", 5, "{code} {text}")
    NO_SUCH_SUBSCRIPTION = (568, "No such subscription", 404, "item-not-found", None, 5,
                            "{text}")
    # XEP-0254 §2.1: a queue node's subscription needs pubsub#queue_requests (SMQP: a 400).
    OPTIONS_REQUIRED = (400, "Bad request", 400, "not-acceptable", "configuration-required", 5,
                        "")

    def __init__(self, smqp: int, phrase: str, http: int, xmpp: str, pubsub: str | None,
                 qqp: int, xmpp_text: str) -> None:
        self.smqp = smqp
        self.phrase = phrase
        self.http = http
        self.xmpp = xmpp
        self.pubsub = pubsub
        self.qqp = qqp
        self.xmpp_text = xmpp_text

    @property
    def title(self) -> str:
        """The REST problem's ``title`` (RFC 9457: the status's phrase)."""
        return HTTPStatus(self.http).phrase

    @property
    def problem_type(self) -> str:
        """The REST problem's ``type``: no page of its own, so ``about:blank`` (RFC 9457
        §4.2.1: the title is then the status's phrase)."""
        return "about:blank"

    def text(self, reason: str = "") -> str:
        """The SMQP reply text: ``"Not found (topic)"``, or the phrase alone."""
        return f"{self.phrase} ({reason})" if reason else self.phrase

    @classmethod
    def of(cls, code: int) -> Refusal:
        """The refusal an SMQP reply code stands for (ValueError for a code no row has):
        the first row with that code, so 400 is :attr:`BAD_REQUEST`."""
        try:
            return _BY_CODE[code]
        except KeyError:
            raise ValueError(f"no refusal has SMQP code {code}") from None


_BY_CODE: dict[int, Refusal] = {}
for _refusal in Refusal:
    _BY_CODE.setdefault(_refusal.smqp, _refusal)


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

    @property
    def refusal(self) -> Refusal:
        return Refusal.of(self.code)

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
