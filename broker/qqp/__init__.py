"""QQP (Quick Queues Protocol) codec, sans-IO: netstring framing, SXDF resources, the
canonical form of the ``Data`` element that signatures cover, the Greeting and status strings.
Bytes in, values out; nothing here does I/O or knows the broker."""
