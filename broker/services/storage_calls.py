"""What the listener's storage processes run (:mod:`broker.store.lanes`,
:mod:`broker.store.worker`): the group commits of :mod:`.publish` and :mod:`.ack`.

A storage process is ``python -m broker.services.storage_calls <socket fd> <database>``: it
loads Django, then serves :data:`CALLS`. The listener's dispatcher gives the store
:data:`LISTENER_SIDE`, which names this module and the same service functions to run on the
listener's database threads when there are no storage processes.

A publish batch's results go back without the data sections (the listener has them, in the
requests, and puts them back: :func:`restore_sections`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from broker.domain.message import Message
from broker.store import worker
from broker.store.backends import Unsent
from broker.store.lanes import StorageCalls, prefork

logger = logging.getLogger("broker.services.storage_calls")


def _publish_batch(requests: list) -> list:
    """:func:`.publish.publish_batch` without sending the data sections back (a batch held
    before is rolled back first: its listener gave up on it)."""
    from .publish import publish_batch

    _abandon_held()
    return _without_sections(publish_batch(requests))


def _without_sections(results: list) -> list:
    from .publish import Published

    for result in results:
        if isinstance(result, Published) and result.payload is not None:
            path, cmuid, message = result.payload
            result.payload = (path, cmuid, message.headers)  # type: ignore[assignment]
    return results


def restore_sections(requests: list, results: list) -> None:
    """The listener's side of :func:`_without_sections`: each publish's data sections, from
    its request, back into its result's payload."""
    from .publish import Published

    for request, result in zip(requests, results, strict=True):
        if isinstance(result, Published) and result.payload is not None:
            path, cmuid, headers = result.payload
            result.payload = (path, cmuid, Message(headers, request.message.sections))


#: The publish batch this process holds open before its COMMIT (see _publish_begin).
_held: Any = None


def _publish_begin(requests: list) -> list:
    """:func:`_publish_batch` up to its COMMIT: the transaction stays open until
    ``publish_commit`` (a batch still held is rolled back first: its listener gave up on it)."""
    global _held
    from .publish import publish_batch_held

    _abandon_held()
    held = publish_batch_held(requests)
    results = next(held)
    _held = held
    return _without_sections(results)


def _publish_commit() -> None:
    """COMMIT the batch :func:`_publish_begin` holds; raises what the COMMIT raised."""
    global _held
    held, _held = _held, None
    if held is None:
        raise RuntimeError("no publish batch is held (nothing committed)")
    try:
        next(held, None)
    except Unsent as exc:  # the link broke before the COMMIT went out: nothing committed
        raise RuntimeError("database connection lost (nothing committed)") from exc


def _abandon_held() -> None:
    global _held
    held, _held = _held, None
    if held is not None:
        logger.warning("a held publish batch was never committed; rolled back")
        held.close()


def _ack_batch(acks: list) -> list:
    from .ack import ack_batch

    return ack_batch(acks)


def _ready() -> None:
    """Answered once the process serves: Django and the services are loaded."""


CALLS = {"publish_batch": _publish_batch, "publish_begin": _publish_begin,
         "publish_commit": _publish_commit, "ack_batch": _ack_batch, "ready": _ready}


def durable(name: str) -> bool:
    """Must the call's commit be on disk before its answer goes? Publishes always; ACKs
    with ``SMQP_ACK_DURABILITY=full`` (by default they commit without a flush)."""
    from django.conf import settings

    return name in ("publish_batch", "publish_commit") or (
        name == "ack_batch" and settings.SMQP_ACK_DURABILITY == "full")


def _publish_batch_here(requests: list) -> list:
    from .publish import publish_batch

    return publish_batch(requests)


#: What the listener's storage lanes are told (:class:`broker.store.lanes.Storage`).
LISTENER_SIDE = StorageCalls(entry="broker.services.storage_calls",
                             publish_batch=_publish_batch_here, ack_batch=_ack_batch,
                             restore=restore_sections)


def fork_storage_processes() -> None:
    """Start this process's storage processes as copies of it, which has loaded Django,
    before any thread or event loop runs (:func:`broker.store.lanes.prefork`): ``runsmqp``,
    ``runqqp`` and Daphne (:mod:`broker.asgi_server`) call it."""
    prefork(LISTENER_SIDE)


def main(argv: list[str]) -> None:
    worker.start_django()
    # What the calls run, loaded now rather than by the first call (which the first
    # publish after a start would wait for, and every publish queued behind it).
    from . import ack, publish  # noqa: F401

    worker.main(argv, CALLS, durable)


if __name__ == "__main__":
    main(sys.argv[1:])
