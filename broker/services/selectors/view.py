"""What a selector sees of a message: its identifiers and their values (profile §9.2).

A :class:`MessageView` is built once per message and read by every subscription's selector.
Keys are identifier names case-folded with ``_`` written ``-`` (so JMS ``X_Region`` and LDAP
``x-region`` name the header ``X-Region``). Each value keeps its text (LDAP matches text) and
its typed value: a number when the text parses as one, else the text (JMS compares numbers as
numbers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from django.conf import settings

#: A header value that is a number. Fixed patterns (never built from user text); the length
#: bound keeps int() away from huge digit strings.
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_MAX_NUMBER_TEXT = 200

Scalar = int | float | str | bool


def identifier_key(name: str) -> str:
    """The view key of an identifier or header name."""
    return name.casefold().replace("_", "-")


def parse_number(text: str) -> int | float | None:
    """The number ``text`` spells (surrounding spaces allowed), or None."""
    text = text.strip()
    if not text or len(text) > _MAX_NUMBER_TEXT:
        return None
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return None


def typed(text: str) -> int | float | str:
    number = parse_number(text)
    return text if number is None else number


class MessageView:
    """The identifiers of one message: ``value(key)`` (typed) and ``text(key)``; None for a
    missing identifier. Doors need not build one by hand: :func:`message_view`."""

    __slots__ = ("_folded", "_texts", "_values")

    def __init__(self, texts: dict[str, str]) -> None:
        self._texts = texts
        self._values: dict[str, Scalar] = {k: typed(v) for k, v in texts.items()}
        # LDAP's case-folded texts, made once per message when a selector first asks.
        self._folded: dict[str, str] = {}

    def folded(self, key: str, fold: Callable[[str], str]) -> str | None:
        """``fold(text(key))``, remembered (every LDAP selector of a message asks)."""
        found = self._folded.get(key)
        if found is None:
            text = self._texts.get(key)
            if text is None:
                return None
            found = self._folded[key] = fold(text)
        return found

    def value(self, key: str) -> Scalar | None:
        return self._values.get(key)

    def text(self, key: str) -> str | None:
        return self._texts.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._texts

    def keys(self) -> Iterable[str]:
        return self._texts.keys()

    def __repr__(self) -> str:
        return f"MessageView({self._texts!r})"


def iso(moment: datetime) -> str:
    """``Created`` as selectors see it: ISO 8601 in UTC, so that text order is time order
    (the SMQP form ``DMMDDYYYY...`` is not)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-4] + "Z"


def message_view(*, topic: str, publisher: str | None = None, name: str = "",
                 priority: int | None = None, created: datetime | None = None,
                 timeout: int | None = None, depth: int | None = None,
                 sequence: int | None = None, headers: Iterable[tuple[str, str]] = (),
                 size: int = 0, content_type: str | None = None) -> MessageView:
    """The view of a message from its stored fields (any door's). ``headers``: the other
    header attributes (``X-*``, ``MIME-Version``), in order (a repeated one: the first).
    ``Timeout`` is its number of seconds; ``Created`` ISO 8601 UTC text (:func:`iso`)."""
    # Selectors read the first SMQP_SELECTOR_MAX_VALUE_CHARS characters of a value: that
    # bounds what one message costs each selector (LIKE, LDAP folding and substrings are
    # linear in it). It is above the longest selector, so =, <>, IN, ordering and prefix
    # patterns answer as on the whole value; only a pattern looking past the cap cannot.
    limit = max(settings.SMQP_SELECTOR_MAX_VALUE_CHARS, settings.SMQP_SELECTOR_MAX_LENGTH)
    texts: dict[str, str] = {}
    for key, value in headers:
        texts.setdefault(identifier_key(key), str(value)[:limit])
    fields: list[tuple[str, object]] = [
        ("name", name or None), ("priority", priority),
        ("created", iso(created) if created is not None else None), ("timeout", timeout),
        ("depth", depth), ("sequence", sequence), ("topic", topic),
        ("publisher", publisher), ("size", size), ("content-type", content_type)]
    for key, value in fields:
        if value is not None:
            texts[key] = str(value)[:limit]
    return MessageView(texts)
