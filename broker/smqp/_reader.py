"""Buffered line reader and message framing shared by ``ServerConnection`` and
``ClientConnection`` (private).

The buffer is one ``bytearray`` plus a read position; lines are found with ``bytes.find``
(resuming where the last search stopped, so a line arriving in many chunks is scanned once)
and data sections are taken by Content-Length slices, never scanned.
"""

from __future__ import annotations

import enum
import re

from .errors import ProtocolError, bad_request
from .message import (
    DataSection,
    check_data_header,
    check_data_header_end,
    check_publish_header,
    parse_header_line,
)

__all__ = ["CLOSED", "NEED_DATA", "Sentinel"]


class Sentinel(enum.Enum):
    """Non-event results of ``next_event``."""

    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"

    def __repr__(self) -> str:
        return self.value


NEED_DATA = Sentinel.NEED_DATA
"""``next_event`` needs more bytes before it can return an event."""
CLOSED = Sentinel.CLOSED
"""The peer closed the connection (``receive_data(b"")``); nothing more will come."""


class _TooLong(enum.Enum):
    TOO_LONG = "TOO_LONG"


TOO_LONG = _TooLong.TOO_LONG

_CTL_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# Printable ASCII and tab: what a header block on the fast path may hold besides its CRLFs.
_PRINTABLE = bytes([9, *range(32, 127)])
_LARGE_COPY = 65536

# Message framing states.
M_NONE = 0
M_HEADER = 1  # message header lines until an empty line
M_SECTION = 2  # start of a data section, or the terminating "."
M_DATA = 3  # data header lines until an empty line
M_BODY = 4  # Content-Length bytes, then CRLF
M_SCAN = 5  # framing lost: skip lines until "."

TOO_LARGE = "Resource too large"

DEFAULT_MAX_LINE = 4096
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 1024 * 1024


def decode_line(line: bytes | bytearray) -> str:
    """Decode a line as UTF-8; control characters (other than tab) are refused."""
    if _CTL_RE.search(line) is not None:
        raise bad_request("control character")
    try:
        return line.decode()
    except UnicodeDecodeError:
        raise bad_request("invalid UTF-8") from None


class Reader:
    """Byte buffer, line splitting with a length limit, and message framing."""

    def __init__(self, max_line: int, max_message: int, max_header_bytes: int) -> None:
        self.max_line = max_line
        self.max_message = max_message
        self.max_header_bytes = max_header_bytes
        self._buf = bytearray()
        self._pos = 0  # first unconsumed byte
        self._scan = 0  # where the search for the next LF resumes (>= _pos)
        self._skipping = False  # discarding the rest of an over-long line
        self._long_head = b""  # first bytes of the last over-long line
        self._eof = False
        self._mstate = M_NONE
        self._mheaders: list[tuple[str, str]] = []
        self._msections: list[DataSection] = []
        self._merror: ProtocolError | None = None
        self._mtotal = 0
        self._hbytes = 0
        self._sec_headers: list[tuple[str, str]] = []
        self._sec_len: int | None = None
        self._sec_bad = False
        self._remaining = 0
        self._discard = False
        self._block_bytes = 0
        # Server side: check PUB attributes line by line as they arrive (first error wins).
        self._validate = False
        self._reply = False
        self._seen: set[str] = set()
        self._sec_seen: set[str] = set()

    # ---------------------------------------------------------------------------- buffer

    def receive_data(self, data: bytes) -> None:
        """Append received bytes; ``b""`` means the peer closed the connection (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            return
        buf = self._buf
        pos = self._pos
        if pos:
            del buf[:pos]
            self._scan -= pos
            self._pos = 0
        if self._skipping and not buf:
            # Still inside an over-long line: drop bytes without buffering them.
            i = data.find(b"\n")
            if i < 0:
                return
            self._skipping = False
            data = data[i + 1 :]
        buf += data

    @property
    def buffer_size(self) -> int:
        """Bytes held in the internal buffer (consumed ones included until compaction)."""
        return len(self._buf)

    def _compact(self) -> None:
        pos = self._pos
        if pos:
            del self._buf[:pos]
            self._scan -= pos
            self._pos = 0

    def _read_line(self) -> bytearray | _TooLong | None:
        """The next line without its CRLF/LF, ``TOO_LONG`` (reported once per line, whose
        rest is then discarded as it arrives) or None when no complete line is buffered."""
        buf = self._buf
        if self._skipping:
            i = buf.find(b"\n", self._pos)
            if i < 0:
                self._pos = self._scan = len(buf)
                return None
            self._skipping = False
            self._pos = self._scan = i + 1
        pos = self._pos
        i = buf.find(b"\n", self._scan)
        if i < 0:
            n = len(buf)
            if n - pos > self.max_line + 1:
                self._long_head = bytes(buf[pos : pos + 16])
                self._skipping = True
                self._pos = self._scan = n
                return TOO_LONG
            self._scan = n
            return None
        end = i
        if end > pos and buf[end - 1] == 13:
            end -= 1
        self._pos = self._scan = i + 1
        if end - pos > self.max_line:
            self._long_head = bytes(buf[pos : pos + 16])
            return TOO_LONG
        return buf[pos:end]

    # ------------------------------------------------------------------- message framing

    def _begin_message(self, error: ProtocolError | None = None) -> None:
        self._seen.clear()
        self._mstate = M_HEADER
        self._mheaders = []
        self._msections = []
        self._merror = error
        self._mtotal = 0
        self._hbytes = 0

    def _take_message(
        self,
    ) -> tuple[list[tuple[str, str]], list[DataSection], ProtocolError | None]:
        result = (self._mheaders, self._msections, self._merror)
        self._mstate = M_NONE
        self._mheaders = []
        self._msections = []
        self._sec_headers = []
        self._merror = None
        return result

    def _fail(self, error: ProtocolError) -> None:
        if self._merror is None:
            self._merror = error

    def _message_header(self, line: bytearray) -> None:
        try:
            text = decode_line(line)
        except ProtocolError as e:
            self._count_header(len(line))
            self._fail(e)
            return
        self._message_header_text(text, len(line))

    def _count_header(self, nbytes: int) -> None:
        self._hbytes += nbytes + 2
        if self._hbytes > self.max_header_bytes:
            self._fail(ProtocolError(414, TOO_LARGE))

    def _message_header_text(self, text: str, nbytes: int) -> None:
        self._count_header(nbytes)
        if self._merror is not None:
            return
        try:
            name, value = parse_header_line(text)
            if self._validate:
                check_publish_header(name, value, self._seen, reply=self._reply)
        except ProtocolError as e:
            self._fail(e)
            return
        self._mheaders.append((name, value))

    def _data_header(self, line: bytearray) -> None:
        try:
            text = decode_line(line)
        except ProtocolError as e:
            self._count_header(len(line))
            self._fail(e)
            if line[:15].lower() == b"content-length:":
                self._sec_bad = True
            return
        self._data_header_text(text, len(line))

    def _data_header_text(self, text: str, nbytes: int) -> None:
        self._count_header(nbytes)
        if text[:15].lower() == "content-length:":
            value = text[15:].strip(" \t")
            if self._sec_len is not None or self._sec_bad:
                self._fail(bad_request("duplicate Content-Length"))
                self._sec_bad = True
            elif not (value.isascii() and value.isdigit()) or len(value) > 18:
                self._fail(bad_request("invalid Content-Length"))
                self._sec_bad = True
            else:
                self._sec_len = int(value)
            return
        if self._merror is not None:
            return
        try:
            name, value = parse_header_line(text)
            if self._validate:
                check_data_header(name, self._sec_seen)
        except ProtocolError as e:
            self._fail(e)
            return
        self._sec_headers.append((name, value))

    def _fast_block(self) -> list[str] | None:
        """Fast path for a whole header block: when the buffer holds its lines and the
        terminating empty line, all CRLF-terminated printable ASCII, no line ``.``, and the
        block fits in ``max_line``, consume it and return its lines; else None (the caller
        then goes line by line, which gives the same result)."""
        if self._skipping:
            return None
        buf = self._buf
        pos = self._pos
        if buf.startswith(b"\r\n", pos) or buf.startswith(b".", pos):
            return None
        e = buf.find(b"\r\n\r\n", pos, pos + self.max_line + 4)
        if e < 0:
            return None
        block = buf[pos:e]
        # What is left after deleting printable ASCII must be exactly the CRLFs that
        # separate the lines: no other control byte, no non-ASCII, no bare CR or LF.
        if block.translate(None, _PRINTABLE) != b"\r\n" * block.count(b"\r\n"):
            return None
        lines = block.decode("ascii").split("\r\n")
        if "." in lines:
            return None
        self._pos = self._scan = e + 4
        self._block_bytes = e - pos + 2
        return lines

    def _fast_headers(self, lines: list[str]) -> None:
        """Message header lines of a fast-path block whose bytes are already counted."""
        headers = self._mheaders
        validate = self._validate
        seen = self._seen
        reply = self._reply
        try:
            for text in lines:
                name, value = parse_header_line(text)
                if validate:
                    check_publish_header(name, value, seen, reply=reply)
                headers.append((name, value))
        except ProtocolError as e:
            self._fail(e)

    def _end_data_header(self) -> None:
        n = self._sec_len
        if n is None or self._sec_bad:
            self._fail(bad_request("missing Content-Length"))
            self._mstate = M_SCAN
            return
        if self._validate and self._merror is None:
            try:
                check_data_header_end(self._sec_seen)
            except ProtocolError as e:
                self._fail(e)
        self._mtotal += n
        if self._mtotal > self.max_message:
            self._fail(ProtocolError(414, TOO_LARGE))
        self._remaining = n
        self._discard = self._merror is not None
        self._mstate = M_BODY

    def _read_body(self) -> bool:
        """Consume one section's data and its line end; False when more bytes are needed."""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        n = self._remaining
        if self._discard and n:
            if avail < n:
                self._remaining = n - avail
                self._pos = self._scan = len(buf)
                return False
            pos += n
            avail -= n
            self._pos = self._scan = pos
            self._remaining = n = 0
        if avail <= n:
            return False
        p = pos + n
        c = buf[p]
        if c == 10:
            end = p + 1
        elif c == 13 and avail > n + 1 and buf[p + 1] == 10:
            end = p + 2
        elif c == 13 and avail == n + 1:
            return False
        else:
            self._fail(bad_request("data not followed by CRLF"))
            self._pos = self._scan = p
            self._mstate = M_SCAN
            return True
        if not self._discard:
            if n > _LARGE_COPY:
                view = memoryview(buf)
                try:
                    body = bytes(view[pos:p])
                finally:
                    view.release()
            else:
                body = bytes(buf[pos:p])
            self._msections.append(DataSection(self._sec_headers, body))
        self._pos = self._scan = end
        self._mstate = M_SECTION
        return True

    def _advance_message(self) -> bool:
        """Run the message framing; True once the terminating ``.`` line is consumed (the
        result, or the first error met, is then in ``_take_message()``)."""
        while True:
            st = self._mstate
            if st == M_BODY:
                if not self._read_body():
                    return False
                continue
            if st in (M_HEADER, M_SECTION):
                lines = self._fast_block()
                if lines is not None:
                    if st == M_HEADER:
                        nbytes = self._block_bytes
                        if self._merror is None and (
                            self._hbytes + nbytes <= self.max_header_bytes
                        ):
                            self._hbytes += nbytes
                            self._fast_headers(lines)
                        else:
                            for text in lines:
                                self._message_header_text(text, len(text))
                        self._mstate = M_SECTION
                    else:
                        self._sec_headers = []
                        self._sec_seen.clear()
                        self._sec_len = None
                        self._sec_bad = False
                        for text in lines:
                            self._data_header_text(text, len(text))
                        self._end_data_header()
                    continue
            line = self._read_line()
            if line is None:
                return False
            if st == M_SCAN:
                if line == b".":
                    return True
                continue
            if line is TOO_LONG:
                self._fail(bad_request("line too long"))
                continue
            if st == M_SECTION:
                if line == b".":
                    return True
                if line:
                    self._sec_headers = []
                    self._sec_seen.clear()
                    self._sec_len = None
                    self._sec_bad = False
                    self._mstate = M_DATA
                    self._data_header(line)
            elif st == M_HEADER:
                if not line:
                    self._mstate = M_SECTION
                elif line == b".":
                    self._fail(bad_request("missing empty line after header"))
                    return True
                else:
                    self._message_header(line)
            elif not line:
                self._end_data_header()
            elif line == b".":
                self._fail(bad_request("incomplete data section"))
                return True
            else:
                self._data_header(line)

    def _need(self) -> Sentinel:
        self._compact()
        return CLOSED if self._eof else NEED_DATA
