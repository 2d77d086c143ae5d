"""A real link supervisor (``manage.py runlinks``) on an ops stack's database, with two
federation links: ``loop`` to the stack's own listener (it logs in and is up) and ``dead``
to a port nobody listens on (down, with the connection error as its last error)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import ROOT, free_port, run_manage, stop_process
from tests.support.federation_net import FAST_LINKS
from tests.support.ops_stack import OpsStack


@contextmanager
def two_links(stack: OpsStack) -> Iterator[int]:
    """Yields the closed port ``dead`` points at. The links are removed on the way out."""
    dead_port = free_port()  # bound and released: nothing listens there
    run_manage(stack.env, "link", "add", "loop", "--host", stack.smqp.host, "--port",
               str(stack.smqp.port), "--account", "alice", "--password", "pw",
               "--peer-account", "bob")
    run_manage(stack.env, "link", "add", "dead", "--host", "127.0.0.1", "--port",
               str(dead_port), "--account", "alice", "--password", "pw")
    log = stack.smqp.var_dir / f"runlinks-{uuid.uuid4().hex[:6]}.log"
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runlinks"],
                            env={**stack.env, **FAST_LINKS}, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        yield dead_port
    finally:
        stop_process(proc)
        for name in ("loop", "dead"):
            run_manage(stack.env, "link", "remove", name, check=False)
