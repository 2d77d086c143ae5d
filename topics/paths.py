"""Topic path rules (profile §4), in one place. Syntax comes from the SMQP codec; the rules
that need the tree (reserved names, the account subtree) live here too."""

from __future__ import annotations

from broker.domain.errors import ProtocolError
from broker.domain.values import is_reserved_segment, topic_key, validate_topic

ACCOUNTS_ROOT = "/accounts"

__all__ = [
    "ACCOUNTS_ROOT",
    "InvalidTopicPath",
    "check_creatable",
    "is_under_accounts",
    "parent_path",
    "path_key",
    "segments",
    "validate_path",
]


class InvalidTopicPath(ValueError):
    """A path that breaks the topic syntax or names a reserved segment."""


def validate_path(path: str) -> str:
    """Return ``path`` if it is a syntactically valid topic, else raise InvalidTopicPath."""
    try:
        return validate_topic(path)
    except ProtocolError as exc:
        raise InvalidTopicPath(f"{path!r} is not a valid topic path") from exc


def check_creatable(path: str) -> str:
    """Validate a path that is about to name a stored topic: no segment may be ``Trash``."""
    validate_path(path)
    if any(is_reserved_segment(seg) for seg in segments(path)):
        raise InvalidTopicPath("Trash is a reserved topic name")
    return path


def path_key(path: str) -> str:
    """The case-folded key topics are compared and stored under."""
    return topic_key(path)


def segments(path: str) -> list[str]:
    return [s for s in path.split("/") if s]


def parent_path(path: str) -> str | None:
    """``/a/b`` → ``/a``; a first-level topic has no parent topic (None)."""
    head, _, _ = path.rpartition("/")
    return head or None


def is_under_accounts(path: str) -> bool:
    key = path_key(path)
    return key == ACCOUNTS_ROOT or key.startswith(ACCOUNTS_ROOT + "/")
