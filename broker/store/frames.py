"""The frames between a listener and its storage processes (:mod:`.lanes`, :mod:`.worker`).

A frame is an 8-byte big-endian length and a pickle: a call (number, name, arguments, cache
generations), or its answer (number, ok, result or exception). Answers may come in another
order than the calls. Both ends are this program: the pickles never cross a trust boundary.
"""

from __future__ import annotations

import struct

#: The length in front of each pickle.
LENGTH = struct.Struct("!Q")


def take_frame(buffer: bytearray) -> bytes | None:
    """The first whole frame's pickle, taken out of ``buffer``; None while it is partial."""
    if len(buffer) < LENGTH.size:
        return None
    end = LENGTH.size + LENGTH.unpack_from(buffer)[0]
    if len(buffer) < end:
        return None
    data = bytes(memoryview(buffer)[LENGTH.size:end])
    del buffer[:end]
    return data
