"""The broker's own types, shared by every layer and every door: no Django, no I/O.

- :mod:`.message`: :class:`~.message.Message` and :class:`~.message.DataSection`, what a
  publish carries whichever door it came through.
- :mod:`.values`: the value syntax (topics, patterns, date-times, timeouts, smuid sets ...).
- :mod:`.errors`: :class:`~.errors.ProtocolError`, a value or command that does not parse.
"""
