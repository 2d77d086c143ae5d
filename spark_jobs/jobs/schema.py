"""The files one report day is exported to, shared by the export (Django side) and the job
(Spark side). Plain constants: importing this pulls in neither Django nor Spark."""

from __future__ import annotations

#: The day's usage events, one row each (``events.parquet``). ``door``, ``receivers``,
#: ``reason`` and ``dead_account`` are read out of the event's JSON ``detail`` by the export,
#: so that the job never parses JSON.
EVENTS_FILE = "events.parquet"
EVENT_COLUMNS = ("id", "at", "kind", "account", "topic", "smuid", "bytes", "door",
                 "receivers", "reason", "dead_account")

#: Publish events of earlier days of the messages that the day's ACK, expiry and dead-letter
#: events name (``prior.parquet``): their topic, publisher, size and publish time.
PRIOR_FILE = "prior.parquet"
PRIOR_COLUMNS = ("smuid", "at", "account", "topic", "bytes", "door")

#: The day and what the job cannot see in the day's events: how many sessions and MESSAGE
#: subscriptions were open when it began (``meta.json``).
META_FILE = "meta.json"

#: The door of events that name none: ACKs written before ACKs named theirs (then SMQP and
#: XMPP ones alike), republishes (SMQP's REPUBLISH), expiries and dead letters whose publish
#: is not known.
DEFAULT_DOOR = "smqp"
#: The key of events whose topic is unknown (an ACK of a message whose publish event is
#: older than the retention).
UNKNOWN_TOPIC = "(unknown)"
