"""The codec's one exception type: the broker's :class:`~broker.domain.errors.ProtocolError`."""

from broker.domain.errors import ProtocolError, bad_request

__all__ = ["ProtocolError", "bad_request"]
