"""The delivery layer: between the doors and the services.

- :mod:`.dispatcher`: the per-process dispatcher, the facade the sessions talk to. It
  composes :mod:`.commit` (group commit of publishes and ACKs, run in the store's storage
  processes, and the ACK journal), :mod:`.wakeups` (committed messages offered to the
  subscriber sessions of this process directly and of other processes through Redis; who
  else is on the dispatch group), :mod:`.sweeps` (backlog and subscription sweeps),
  :mod:`.cache` (payloads for NOTIFY, policies, rights) and :mod:`.health` (the operators'
  counters).
- :mod:`.mailbox`: what one subscriber session has waiting, in flight, to retry and locked
  (pure: no I/O; the locks themselves are the store's, :mod:`broker.services.locks`).
- :mod:`.session`: one subscriber session, shared by every door: it drives the mailbox (the
  pump, retry and lock timers, backlog reading, release on close); the door passes in its
  wire work.
- :mod:`.linger`: when a publish batch goes (pure).

Doors import from here; the services never do (they announce commits through
:mod:`broker.services.notify`).
"""

from .dispatcher import Dispatcher, get_dispatcher, recover_journals, shutdown
from .mailbox import GIVE_UP, LOCK_ENDED, NEED_PAGE, RETRY, Mailbox

__all__ = ["GIVE_UP", "LOCK_ENDED", "NEED_PAGE", "RETRY", "Dispatcher", "Mailbox",
           "get_dispatcher", "recover_journals", "shutdown"]
