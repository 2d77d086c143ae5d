"""A federation link runs on one node of a cluster: two link supervisors (``runlinks``) on
A's database, only the holder of the link's lease connects to B; killed with SIGKILL, the
other takes the link over once the lease lapses, and messages flow again. A link whose lease
renewal hangs stops before the lease could pass to another node."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import rows_locked
from tests.e2e.federation.test_triangle import publish, subscribe, wait_subscribed
from tests.support.federation_net import LINK, Domain, prepared, wait_for
from tests.support.processes import connected_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TTL = 3.0


@contextmanager
def linked(base: Path) -> Iterator[tuple[Domain, Domain]]:
    """Listeners of A and B (PostgreSQL, lease TTL), and A's link ``b`` to B, not yet run."""
    with prepared("postgres", base, ("a", "b"),
                  extra_env={"SMQP_LEASE_SECONDS": str(TTL)}) as domains:
        a, b = domains["a"], domains["b"]
        a.start_listener()
        b.start_listener()
        a.shell(LINK.format(links=[("b", b.host, b.port, "a")]))
        yield a, b


def test_link_runs_on_the_lease_holder_and_moves_when_it_dies(tmp_path):
    with linked(tmp_path) as (a, b):
        first = a
        first.start_links()
        # A second supervisor on A's database: a second node of A's cluster.
        second_node = type(a)("a2", a.context, {**a.env, "SMQP_NODE_NAME": "a2"}, a.var)
        second_node.start_links()
        supervisors = {first.links.pid, second_node.links.pid}
        bob = subscribe(a, "/b/news/d1")
        wait_subscribed(a, "b", "/news/d1")
        holder = wait_for(lambda: connected_pids(b.port) & supervisors, 60,
                          "a supervisor to connect to B")
        for _ in range(int(TTL * 2 / 0.25)):  # several renewals: still one, the same
            assert connected_pids(b.port) & supervisors == holder
            time.sleep(0.25)
        publish(b, "/news/d1", 1, n=3, tag="before")
        for _ in range(3):
            bob.message(timeout=60)
            bob.ack()
        dying = first if holder == {first.links.pid} else second_node
        survivor = second_node if dying is first else first
        killed_at = time.monotonic()
        dying.links.send_signal(signal.SIGKILL)
        dying.links.wait()
        wait_for(lambda: connected_pids(b.port) & supervisors == {survivor.links.pid}, 90,
                 "the other supervisor to take the link over")
        print(f"link taken over {time.monotonic() - killed_at:.1f} s after its holder died "
              f"(lease {TTL} s)")
        publish(b, "/news/d1", 1, n=3, tag="after")
        got = []
        for _ in range(3):
            got.append(bob.message(timeout=120))
            bob.ack()
        assert len(got) == 3
        bob.close()
        second_node.stop()


def test_a_link_stops_while_its_lease_renewal_hangs_and_starts_again_after(tmp_path):
    """The supervisor's fence: a renewal that hangs (here on the lease row's lock, as on a
    database that stopped answering) must not keep the link running past its lease, when
    another node may take it over. It runs again once a renewal holds the lease."""
    with linked(tmp_path) as (a, b):
        a.start_links()
        assert a.links is not None and a.links_log is not None
        pid = a.links.pid
        wait_for(lambda: pid in connected_pids(b.port), 60, "the link to connect to B")
        [(link_id,)] = a.sql("SELECT id FROM broker_link WHERE name = ?", ("b",))
        with rows_locked(a.env, "SELECT holder FROM broker_cluster_lease WHERE name = %s "
                         "FOR UPDATE", (f"link:{link_id}",)):
            locked_at = time.monotonic()
            wait_for(lambda: pid not in connected_pids(b.port), 30, "the link to stop")
            print(f"link stopped {time.monotonic() - locked_at:.1f} s after its renewal hung "
                  f"(lease {TTL} s)")
            assert "lease lapsed; stopping it here" in a.links_log.read_text()
            time.sleep(TTL)  # past the hung renewal's own fence: it stays stopped
            assert pid not in connected_pids(b.port) and a.links.poll() is None
        wait_for(lambda: pid in connected_pids(b.port), 60, "the link to run again")
