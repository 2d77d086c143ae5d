"""Netstrings (``<length>:<bytes>,``) with the strict reading QQP needs: decimal length digits
without leading zeros, at most ``MAX_DIGITS`` of them, and the trailing comma checked."""

from __future__ import annotations

from .errors import OverLimit, QQPError

#: Length digits accepted; more is refused before any body is buffered.
MAX_DIGITS = 10


def encode(body: bytes) -> bytes:
    return b"%d:%b," % (len(body), body)


def parse_length(digits: bytes) -> int:
    """A length field: ``0`` or digits without a leading zero, at most MAX_DIGITS."""
    if not digits or len(digits) > MAX_DIGITS or not digits.isdigit() or not digits.isascii():
        raise QQPError("bad netstring length")
    if digits[0:1] == b"0" and len(digits) > 1:
        raise QQPError("leading zero in a netstring length")
    return int(digits)


def item_size(length: int) -> int:
    """The size QQP counts for an item: the body, its length digits, ``:`` and ``,``."""
    return length + len(str(length)) + 2


class NetstringReader:
    """Bytes in, complete netstring bodies out (never a partial one).

    ``item_limit`` bounds one item's size and ``session_limit`` the total of the items of
    the connection; both are checked on the length field, before the body is buffered."""

    def __init__(self, item_limit: int | None = None, session_limit: int | None = None) -> None:
        self.item_limit = item_limit
        self.session_limit = session_limit
        self.received = 0  # sizes of the items read so far
        self._buffer = bytearray()
        self._length: int | None = None  # of the body being read, once its header was
        #: The error that ended the stream after the bodies the last feed returned.
        self.error: QQPError | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies ``data`` completes. A malformed stream raises QQPError, unless whole
        bodies came before the fault in this call: those are returned, and :attr:`error`
        holds the fault (the next feed raises it). Nothing is read after a fault."""
        if self.error is not None:
            raise self.error
        self._buffer += data
        bodies: list[bytes] = []
        try:
            while self._next(bodies):
                pass
        except QQPError as exc:
            self.error = exc
            if not bodies:
                raise
        return bodies

    def _next(self, bodies: list[bytes]) -> bool:
        buf = self._buffer
        if self._length is None:
            colon = buf.find(b":", 0, MAX_DIGITS + 1)
            if colon < 0:
                if len(buf) > MAX_DIGITS or (buf and not bytes(buf).isdigit()):
                    raise QQPError("bad netstring length")
                return False
            length = parse_length(bytes(buf[:colon]))
            size = item_size(length)
            if self.item_limit is not None and size > self.item_limit:
                raise OverLimit(f"item of {size} bytes over the ItemLimit {self.item_limit}",
                                session=False)
            if self.session_limit is not None and self.received + size > self.session_limit:
                raise OverLimit(f"item of {size} bytes over the SessionLimit", session=True)
            del buf[:colon + 1]
            self._length = length
        length = self._length
        if len(buf) <= length:
            return False
        if buf[length] != 0x2C:  # ","
            raise QQPError("netstring without its trailing comma")
        bodies.append(bytes(buf[:length]))
        del buf[:length + 1]
        self._length = None
        self.received += item_size(length)
        return True

    @property
    def pending(self) -> bool:
        """Part of an item has been read."""
        return bool(self._buffer) or self._length is not None
