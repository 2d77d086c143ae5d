"""Content-based subscriptions: message selectors (profile §9.2), for every door.

The API a door needs (SMQP today; XMPP ``pubsub#selector`` and REST subscriptions use the
same calls)::

    from broker.services.selectors import SelectorError, compile_selector, message_view

    try:
        selector = compile_selector("JMS", "X_Region = 'emea' AND Priority < 3")
    except SelectorError as exc:      # a ServiceError: exc.code is 566 or 567,
        ...                           # exc.what and exc.column (1-based) say why and where
    view = message_view(topic="/stocks/ibm", publisher="jtegen", priority=1,
                        headers=[("X-Region", "emea")])
    selector.matches(view)            # True

* ``compile_selector(cls, text)``: ``cls`` is ``JMS`` or ``RFC-2254`` (``LDAP`` is the
  same class), case-insensitive; anything else is 566. The text is parsed by a lark
  grammar (:mod:`.jms`, :mod:`.ldap`) and compiled once; compiled selectors are cached by
  (class, text), so a door may call this per message without parsing again. Bounded by
  ``SMQP_SELECTOR_MAX_LENGTH`` characters and ``SMQP_SELECTOR_MAX_DEPTH`` levels of
  nesting (567 beyond either).
* ``Selector.matches(view)`` is True only when the selector is TRUE for the message
  (FALSE and UNKNOWN / Undefined select the message out). ``Selector.cls`` is the
  canonical class name, ``Selector.text`` the text as given (leading and trailing spaces
  removed): the pair that identifies a subscription's selector.
* ``message_view(...)`` builds what selectors see of a message (:mod:`.view`); the
  services build it for stored messages (:func:`view_of_message`) and for messages being
  published.

The subscription rules themselves (several selectors per pattern, one delivery when
several match, UNSUB of one, 568) are in :mod:`broker.services.subscriptions`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from .errors import (
    INCORRECT,
    NO_SUCH_SUBSCRIPTION,
    UNSUPPORTED,
    SelectorError,
    incorrect,
    unsupported,
)
from .jms import compile_jms
from .ldap import compile_ldap
from .view import MessageView, identifier_key, message_view

__all__ = [
    "INCORRECT",
    "NO_SUCH_SUBSCRIPTION",
    "UNSUPPORTED",
    "MessageView",
    "Selector",
    "SelectorError",
    "canonical_class",
    "compile_selector",
    "identifier_key",
    "message_view",
]

logger = logging.getLogger("broker.selectors")

JMS = "JMS"
LDAP = "RFC-2254"
_CLASSES = {"JMS": JMS, "RFC-2254": LDAP, "RFC2254": LDAP, "LDAP": LDAP}
_COMPILERS: dict[str, Callable[[str, int], Callable[[MessageView], Any]]] = {
    JMS: compile_jms, LDAP: compile_ldap}


def canonical_class(cls: str) -> str:
    """``JMS`` or ``RFC-2254`` for a class name the profile accepts; 566 otherwise."""
    found = _CLASSES.get(cls.strip().upper())
    if found is None:
        raise unsupported(cls)
    return found


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: immutable, shareable across threads."""

    cls: str
    text: str
    _fn: Callable[[MessageView], Any] = field(repr=False, compare=False)

    def matches(self, view: MessageView) -> bool:
        return self._fn(view) is True

    def evaluate(self, view: MessageView) -> bool | None:
        """Three-valued: True, False or None (UNKNOWN / Undefined)."""
        result = self._fn(view)
        return result if isinstance(result, bool) else None


def compile_selector(cls: str, text: str) -> Selector:
    """The compiled selector of class ``cls`` (566 when unsupported) for ``text`` (567 when
    it is incorrect, too long or too deeply nested). Cached."""
    canonical = canonical_class(cls)
    text = text.strip()
    limit = settings.SMQP_SELECTOR_MAX_LENGTH
    if len(text) > limit:
        raise incorrect(f"longer than {limit} characters", limit + 1)
    if not text:
        raise incorrect("empty selector", 1)
    return _compile(canonical, text, settings.SMQP_SELECTOR_MAX_DEPTH)


@functools.lru_cache(maxsize=4096)
def _compile(cls: str, text: str, max_depth: int) -> Selector:
    # A refusal raises and is not cached (lru_cache keeps results only).
    return Selector(cls, text, _COMPILERS[cls](text, max_depth))


#: What a stored selector that no longer compiles (its limits were lowered since) is:
#: it selects nothing, rather than everything.
NEVER = Selector("", "", lambda view: False)


@functools.lru_cache(maxsize=8192)
def stored_selector(cls: str, text: str) -> Selector | None:
    """The selector of a stored subscription; None when it has none (``cls`` empty). Cached
    on the stored pair: a publish batch reads every subscription of its topics."""
    if not cls:
        return None
    try:
        return compile_selector(cls, text)
    except SelectorError:
        logger.warning("stored %s selector no longer compiles: %r", cls, text[:100])
        return NEVER


def view_of_message(message: Any, *, topic: str, publisher: str | None,
                    content_type: str | None) -> MessageView:
    """The view of a stored :class:`broker.models.Message` (its other fields passed in)."""
    return message_view(
        topic=topic, publisher=publisher, name=message.name, priority=message.priority,
        created=message.created, timeout=message.timeout, depth=message.depth,
        sequence=message.sequence, headers=[tuple(h) for h in message.headers],
        size=message.size, content_type=content_type)

