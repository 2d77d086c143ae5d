"""Durability and scale-out over real processes: kill -9 of the listener loses nothing that
was acknowledged, redelivers nothing ACKed and everything un-ACKed; two listeners share the
database and Redis; Celery sweeps run in a real worker on Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import (
    ROOT,
    accounts_script,
    fresh_database,
    start_listener,
    stop_listener,
)
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SETUP = accounts_script("root", "bob") + """
from topics.models import Topic
from ual.models import UALEntry
d = Topic.objects.create(path='/d')
Topic.objects.create(path='/d/exp', parent=d)
UALEntry.objects.create(topic=d, principal_kind='account',
                        account=Account.objects.get(username='bob'), right='subscribe')
from topics import tree
tree.changed()
"""


@pytest.fixture(params=["sqlite", "postgres"])
def env(request, tmp_path):
    """A database of the test's own (each test kills or shares listeners on it), copied from
    a template the setup was run in once per test process."""
    with fresh_database(request.param, tmp_path, setup=SETUP) as environment:
        yield environment, tmp_path


def kill9(broker) -> None:
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(timeout=scaled(10))


def test_kill_9_loses_nothing_acknowledged(env):
    environment, var = env
    broker = start_listener(environment, var, name="d1")
    with Session(broker.host, broker.port, "bob") as bob:
        assert bob.command("SUB MESSAGE /d").code == 200
    # Pipeline publishes and kill the listener while replies are still coming.
    with Session(broker.host, broker.port, "root") as pub:
        total = 3000
        for i in range(total):
            pub.send_publish("/d", f"K{i}")
        confirmed = []
        for _ in range(total // 3):
            confirmed.append(smuid_of(pub.reply()))
        kill9(broker)
    assert len(confirmed) == total // 3
    broker = start_listener(environment, var, name="d2")
    try:
        with Session(broker.host, broker.port, "root") as root:
            stored = root.command("LIST MESSAGE /d").lines[-1]
        from broker.smqp.values import parse_smuid_list

        kept = parse_smuid_list(stored)
        assert all(s in kept for s in confirmed)  # every 200 survived kill -9
        # Deliver: ACK the first half, leave one un-ACKed, kill again.
        with Session(broker.host, broker.port, "bob") as bob:
            acked = []
            for _ in range(len(confirmed) // 2):
                note = bob.message()
                acked.append(int(header(note, "Smuid").rsplit("/", 1)[1]))
                bob.ack()
            unacked = int(header(bob.message(), "Smuid").rsplit("/", 1)[1])
            kill9(broker)
        assert acked == sorted(acked) and unacked > acked[-1]
        broker = start_listener(environment, var, name="d3")
        with Session(broker.host, broker.port, "bob") as bob:
            first = int(header(bob.message(), "Smuid").rsplit("/", 1)[1])
            assert first == unacked  # nothing ACKed comes back; the un-ACKed does
            bob.ack()
            assert bob.command("UNSUB *").code == 200
    finally:
        stop_listener(broker)
    assert "Traceback" not in broker.log()


def test_two_listeners_share_the_work(env):
    environment, var = env
    a = start_listener(environment, var, name="a")
    b = start_listener(environment, var, name="b")
    try:
        with Session(a.host, a.port, "bob") as bob, Session(b.host, b.port, "root") as pub:
            assert bob.command("SUB MESSAGE /d").code == 200
            sent = [smuid_of(pub.publish("/d", f"T{i}")) for i in range(100)]
            got = []
            for _ in sent:
                got.append(int(header(bob.message(), "Smuid").rsplit("/", 1)[1]))
                bob.ack()
            assert got == sent  # in order, once
            assert bob.quiet(1.5)
            bob.command("UNSUB *")
    finally:
        stop_listener(a)
        stop_listener(b)


@pytest.mark.parametrize("sweep", ["1", "0"])
def test_a_lost_wake_up_delays_a_message_by_one_sweep_period(env, sweep):
    """Listener B hears nothing of A's wake-ups (another channel-layer prefix: as if each of
    them were lost on the way). B's idle session still gets what A stored, in order, from
    B's backlog sweep; with the sweep off it gets nothing until it logs in again."""
    environment, var = env
    a = start_listener(environment, var, name="a")
    b = start_listener({**environment, "SMQP_CHANNEL_PREFIX": f"other-{uuid.uuid4().hex[:8]}",
                        "SMQP_BACKLOG_SWEEP_SECONDS": sweep}, var, name="b")
    try:
        with Session(b.host, b.port, "bob") as bob, Session(a.host, a.port, "root") as pub:
            assert bob.command("SUB MESSAGE /d").code == 200
            sent = [smuid_of(pub.publish("/d", f"L{i}")) for i in range(3)]
            if sweep == "0":
                assert bob.quiet(3)
            else:
                got = []
                for _ in sent:
                    got.append(int(header(bob.message(timeout=10), "Smuid").rsplit("/", 1)[1]))
                    bob.ack()
                assert got == sent
                assert bob.quiet(2.5)  # and each only once
            bob.command("UNSUB *")
    finally:
        stop_listener(a)
        stop_listener(b)


def test_celery_worker_moves_expired_messages_to_trash(env):
    environment, var = env
    environment = {**environment, "SMQP_EXPIRY_SWEEP_SECONDS": "1"}
    broker = start_listener(environment, var, name="c")
    log = (var / "celery.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "broker", "worker", "-B", "--loglevel", "INFO",
         "--concurrency", "1", "--schedule", str(var / "beat-schedule")],
        env=environment, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        with Session(broker.host, broker.port, "root") as root:
            smuid = smuid_of(root.publish("/d/exp", "E1", [("Timeout", "00:00:01")]))
            deadline = time.monotonic() + scaled(60)
            while time.monotonic() < deadline:
                trash = root.command("LIST MESSAGE /d/exp/Trash").lines[-1]
                if trash != "none":
                    break
                time.sleep(scaled(0.5))
            assert trash == str(smuid), (var / "celery.log").read_text()[-3000:]
            assert root.command("LIST MESSAGE /d/exp").lines[-1] == "none"
        assert "broker.expire_messages" in (var / "celery.log").read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            worker.kill()
        stop_listener(broker)
        log.close()
    assert os.path.exists(var / "celery.log")
