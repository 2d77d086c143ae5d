"""A federation link runs on one node of a cluster: two link supervisors (``runlinks``) on
A's database, only the holder of the link's lease connects to B; killed with SIGKILL, the
other takes the link over once the lease lapses, and messages flow again."""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.federation.test_triangle import publish, subscribe, wait_subscribed
from tests.support.federation_net import LINK, prepared, wait_for
from tests.support.processes import connected_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TTL = 3.0


def test_link_runs_on_the_lease_holder_and_moves_when_it_dies(tmp_path):
    with prepared("postgres", tmp_path, ("a", "b"),
                  extra_env={"SMQP_LEASE_SECONDS": str(TTL)}) as domains:
        a, b = domains["a"], domains["b"]
        a.start_listener()
        b.start_listener()
        a.shell(LINK.format(links=[("b", b.host, b.port, "a")]))
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
