"""The broker's value syntax, shared by every door (SMQP profile section 4): topics,
patterns, date-times, timeouts, keywords, booleans and smuids. Pure functions; every parse
error is a ``ProtocolError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from .errors import ProtocolError, bad_request

__all__ = [
    "SmuidSet",
    "TopicPattern",
    "format_bool",
    "format_datetime",
    "format_keywords",
    "format_smuid_ranges",
    "format_timeout",
    "is_reserved_segment",
    "parse_bool",
    "parse_datetime",
    "parse_int",
    "parse_keywords",
    "parse_reply_smuid",
    "parse_smuid_header",
    "parse_smuid_list",
    "parse_timeout",
    "parse_topic_pattern",
    "topic_key",
    "validate_keyword",
    "validate_topic",
]

# Integers travel into database columns: keep them within a signed 64-bit range.
_MAX_INT = 2**63 - 1
MAX_INT32 = 2**31 - 1
_INT_RE = re.compile(r"-?[0-9]{1,19}")


def parse_int(
    s: str, *, minimum: int | None = None, maximum: int = _MAX_INT, what: str = "number"
) -> int:
    """Parse a decimal integer (ASCII digits, optional leading ``-``) of at most 19 digits.

    Raises ``ProtocolError(400, "Bad request (invalid <what>)")`` when the text is not such a
    number, is outside ``minimum``..``maximum`` (default: the signed 64-bit range).
    """
    if _INT_RE.fullmatch(s) is None:
        raise bad_request(f"invalid {what}")
    n = int(s)
    if n > maximum or n < -_MAX_INT or (minimum is not None and n < minimum):
        raise bad_request(f"invalid {what}")
    return n


# --------------------------------------------------------------------------------- topics

# \w is "alphanumeric or underscore" exactly as str.isalnum() sees it; the first character of
# every segment must in addition be a letter, which is checked separately.
_TOPIC_RE = re.compile(r"(?:/\w+)+")
_ASCII_TOPIC_RE = re.compile(r"(?:/[A-Za-z][A-Za-z0-9_]*)+")
_INVALID_TOPIC = "invalid topic"


def validate_topic(s: str, *, allow_root: bool = False) -> str:
    """Check topic syntax (``/seg/seg``) and return ``s`` unchanged.

    Each segment starts with a Unicode letter and holds letters, digits and ``_`` only; no
    empty segment, no trailing slash. ``"/"`` alone is accepted only with ``allow_root``.
    Reserved segments (``Trash``) are not rejected here: services decide.
    """
    if _ASCII_TOPIC_RE.fullmatch(s) is not None:
        return s
    if s == "/" and allow_root:
        return s
    if _TOPIC_RE.fullmatch(s) is None:
        raise bad_request(_INVALID_TOPIC)
    for seg in s[1:].split("/"):
        if not seg[0].isalpha():
            raise bad_request(_INVALID_TOPIC)
    return s


def topic_key(s: str) -> str:
    """Return the case-insensitive comparison key of a topic (its case fold)."""
    return s.casefold()


def is_reserved_segment(seg: str) -> bool:
    """True for the reserved segment name ``Trash`` in any case."""
    return seg.casefold() == "trash"


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """A topic, optionally wildcarded.

    ``base`` is a topic, ``"/"`` (for ``/*``, or the root itself when allowed) or ``""`` (for
    the bare ``*`` meaning everything). ``wildcard`` means every descendant of ``base`` at
    any depth; the base itself is not included.
    """

    base: str
    wildcard: bool = False

    def __str__(self) -> str:
        if not self.wildcard:
            return self.base
        if self.base == "":
            return "*"
        if self.base == "/":
            return "/*"
        return self.base + "/*"


def parse_topic_pattern(
    s: str, *, allow_bare_star: bool = False, allow_root: bool = False
) -> TopicPattern:
    """Parse ``/t``, ``/t/*``, ``/*`` and, with ``allow_bare_star``, ``*``.

    ``allow_root`` also accepts ``"/"`` alone (``TopicPattern("/", False)``). The codec
    accepts ``/*``; services refuse it with 510 where the profile says so.
    """
    if s.endswith("*"):
        if s == "*":
            if allow_bare_star:
                return TopicPattern("", True)
            raise bad_request(_INVALID_TOPIC)
        if s == "/*":
            return TopicPattern("/", True)
        if s.endswith("/*"):
            return TopicPattern(validate_topic(s[:-2]), True)
        raise bad_request(_INVALID_TOPIC)
    return TopicPattern(validate_topic(s, allow_root=allow_root), False)


# ----------------------------------------------------------------------------- date-time

_DT_RE = re.compile(
    r"[Dd]([0-9]{2})([0-9]{2})([0-9]{4})[Tt]([0-9]{2})([0-9]{2})([0-9]{2})([0-9]{0,6})[Zz]?"
)
_ISO_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]{1,6}))?([Zz]|[+-][0-9]{2}:?[0-9]{2})?"
)


def format_datetime(dt: datetime) -> str:
    """Format as ``DMMDDYYYYTHHMMSSffZ`` in UTC, truncating to hundredths of a second.

    A naive ``dt`` is taken to be UTC already.
    """
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return (
        f"D{dt.month:02d}{dt.day:02d}{dt.year:04d}T{dt.hour:02d}{dt.minute:02d}"
        f"{dt.second:02d}{dt.microsecond // 10000:02d}Z"
    )


def parse_datetime(s: str) -> datetime:
    """Parse an SMQP date-time into an aware UTC ``datetime``.

    Accepts ``D08232001T14451246Z`` with 0-6 fraction digits and an optional ``Z``, and ISO
    8601 (``2001-08-23T14:45:12.46Z``, ``+00:00`` or another offset, converted to UTC; no
    offset means UTC).
    """
    m = _DT_RE.fullmatch(s)
    try:
        if m is not None:
            month, day, year, hh, mm, ss, frac = m.groups()
            return datetime(
                int(year),
                int(month),
                int(day),
                int(hh),
                int(mm),
                int(ss),
                int(frac.ljust(6, "0")) if frac else 0,
                tzinfo=UTC,
            )
        m = _ISO_RE.fullmatch(s)
        if m is not None:
            year, month, day, hh, mm, ss, frac, off = m.groups()
            tz: timezone = UTC
            if off and off not in ("Z", "z"):
                sign = -1 if off[0] == "-" else 1
                digits = off[1:].replace(":", "")
                delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
                tz = timezone(sign * delta)
            dt = datetime(
                int(year),
                int(month),
                int(day),
                int(hh),
                int(mm),
                int(ss),
                int(frac.ljust(6, "0")) if frac else 0,
                tzinfo=tz,
            )
            return dt.astimezone(UTC)
    except (ValueError, OverflowError):
        pass
    raise bad_request("invalid date-time")


# ------------------------------------------------------------------------------- timeouts

_TIMEOUT_RE = re.compile(r"(?:([0-9]{1,9}):)?([0-9]{1,9}):([0-9]{1,2}):([0-9]{1,2})")
_NEG_INT_RE = re.compile(r"-[0-9]{1,19}")


def parse_timeout(s: str) -> int:
    """Parse ``HH:MM:SS``, ``DD:HH:MM:SS`` or a negative value into seconds.

    Any negative value (``-1``, ``-5``, ``-00:00:01``) means "never expires" and is returned
    as ``-1``. Minutes and seconds must be below 60; hours are not limited (``00:24:00:00``
    is one day). Longer than 2**31-1 seconds (68 years) is refused: use ``-1``.
    """
    if s.startswith("-"):
        if s.startswith("--"):
            raise bad_request("invalid timeout")
        if _NEG_INT_RE.fullmatch(s) is not None:
            return -1 if int(s) else 0
        return -1 if parse_timeout(s[1:]) else 0
    m = _TIMEOUT_RE.fullmatch(s)
    if m is None:
        raise bad_request("invalid timeout")
    dd, hh, mm, ss = m.groups()
    minutes, seconds = int(mm), int(ss)
    if minutes > 59 or seconds > 59:
        raise bad_request("invalid timeout")
    total = (int(dd) if dd else 0) * 86400 + int(hh) * 3600 + minutes * 60 + seconds
    if total > MAX_INT32:
        raise bad_request("invalid timeout")
    return total


def format_timeout(seconds: int) -> str:
    """Format seconds as ``HH:MM:SS`` (under a day) or ``DD:HH:MM:SS``; negative as ``-1``.

    In the day form an hour part of 0 borrows one day, so one day is ``00:24:00:00`` (the
    profile's literal) and two days ``01:24:00:00``.
    """
    if seconds < 0:
        return "-1"
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    if hours < 24:
        return f"{hours:02d}:{minute:02d}:{sec:02d}"
    days, hour = divmod(hours, 24)
    if hour == 0:
        days -= 1
        hour = 24
    return f"{days:02d}:{hour:02d}:{minute:02d}:{sec:02d}"


# ------------------------------------------------------------------------------- keywords

_KEYWORD_BAD_RE = re.compile(r"[/\\,()\x00-\x1f\x7f]")


def validate_keyword(k: str) -> str:
    """Check one keyword and return it unchanged.

    A keyword is non-empty, may hold inner spaces, holds none of ``/ \\ , ( )`` nor control
    characters, and has no leading or trailing space.
    """
    if not k or k != k.strip(" ") or _KEYWORD_BAD_RE.search(k) is not None:
        raise bad_request("invalid keyword")
    return k


def parse_keywords(s: str) -> tuple[str, ...]:
    """Parse ``(KW1,KW2,BIG BLUE)`` into a tuple; ``()`` gives ``()``.

    Spaces around each keyword are dropped; empty elements (``(a,,b)``) do not count, as in
    the draft's ``#rule``.
    """
    if len(s) < 2 or s[0] != "(" or s[-1] != ")":
        raise bad_request("invalid keywords")
    inner = s[1:-1]
    if not inner.strip(" "):
        return ()
    out = []
    for part in inner.split(","):
        kw = part.strip(" ")
        if kw:
            out.append(validate_keyword(kw))
    return tuple(out)


def format_keywords(kws: Iterable[str]) -> str:
    """Format keywords as ``(A,B)``; raises ``ProtocolError`` for an invalid keyword."""
    return "(" + ",".join(validate_keyword(k) for k in kws) + ")"


# ------------------------------------------------------------------------------- booleans

_BOOLS = {"yes": True, "no": False}


def parse_bool(s: str) -> bool:
    """Parse ``YES`` / ``NO`` in any case."""
    try:
        return _BOOLS[s.lower()]
    except KeyError:
        raise bad_request("invalid boolean") from None


def format_bool(b: bool) -> str:
    """Format a boolean as ``YES`` or ``NO``."""
    return "YES" if b else "NO"


# --------------------------------------------------------------------------------- smuids

_RANGE_RE = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,19}))?")


@dataclass(frozen=True, slots=True)
class SmuidSet:
    """A set of server message numbers: ranges (``lo``, ``hi``) inclusive, or ``*`` (all).

    ``str()`` gives the wire form back (``1845-1890,1905`` or ``*``).
    """

    ranges: tuple[tuple[int, int], ...] = ()
    all: bool = False

    def __contains__(self, n: object) -> bool:
        if not isinstance(n, int):
            return False
        if self.all:
            return n > 0
        return any(lo <= n <= hi for lo, hi in self.ranges)

    def __str__(self) -> str:
        if self.all:
            return "*"
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


def parse_smuid_list(s: str) -> SmuidSet:
    """Parse ``1809``, ``1809-1812``, ``1845-1890,1905,1920-1930`` or ``*``.

    Numbers are positive, ``lo <= hi``; ranges are kept as given.
    """
    if s == "*":
        return SmuidSet(all=True)
    ranges = []
    for part in s.split(","):
        m = _RANGE_RE.fullmatch(part.strip(" "))
        if m is None:
            raise bad_request("invalid smuid list")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if lo < 1 or hi < lo or hi > _MAX_INT:
            raise bad_request("invalid smuid list")
        ranges.append((lo, hi))
    return SmuidSet(tuple(ranges))


def format_smuid_ranges(numbers: Iterable[int]) -> str:
    """Compress numbers into ``1809-1812,1845`` (sorted, duplicates merged; empty gives "")."""
    parts: list[str] = []
    lo = hi = None
    for n in sorted(set(numbers)):
        if hi is not None and n == hi + 1:
            hi = n
            continue
        if lo is not None:
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
        lo = hi = n
    if lo is not None:
        parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return ",".join(parts)


def parse_smuid_header(s: str) -> tuple[str, int]:
    """Split a header smuid ``www.host.com/1835`` into ``("www.host.com", 1835)``.

    The host part may itself hold ``/`` (a server context such as ``www.domain.com/orange``);
    the number is after the last one.
    """
    host, sep, num = s.rpartition("/")
    if not sep or not host or host != host.strip() or " " in host:
        raise bad_request("invalid smuid")
    try:
        return host, parse_int(num, minimum=1, what="smuid")
    except ProtocolError:
        raise bad_request("invalid smuid") from None


def parse_reply_smuid(s: str) -> int:
    """The smuid a PUB REPLY names in its ``Smuid:`` header (profile §9.1): ``host/number`` or
    a bare number."""
    if s.isdigit():
        try:
            return parse_int(s, minimum=1, what="smuid")
        except ProtocolError:
            raise bad_request("invalid smuid") from None
    return parse_smuid_header(s)[1]
