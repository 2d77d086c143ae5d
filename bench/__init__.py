"""Benchmarks for the SMQP broker (``python -m bench``, ``make bench``).

Benchmarks are not tests: they start an isolated broker of their own, drive it over real
sockets and print measured figures; nothing asserts timing.

Modules:

- :mod:`bench.isolated`: start an isolated broker (temp dir, fresh SQLite or PostgreSQL
  database, unique Redis prefixes, ``manage.py runsmqp`` on a free port) as a context manager.
- :mod:`bench.client`: a small asyncio SMQP client (greeting, login, command -> reply).
- :mod:`bench.stats`: latency samples, percentiles, table and JSON output.
- :mod:`bench.smqp_load`: the ``commands`` benchmark (mixed LIST/FIND/COUNT/NOOP load).

A further benchmark is a module with ``add_arguments(parser)`` and ``main(args) -> int``,
registered in :data:`bench.__main__.BENCHMARKS`.
"""
