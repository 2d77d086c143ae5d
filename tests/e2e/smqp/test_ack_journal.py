"""The ACK journal (:mod:`broker.store.journal`) over real sockets against real listeners.

``310 ACK`` goes once the ACK is in the listener's journal, not after the database commit:
here the storage processes that would commit it are stopped (SIGSTOP), and the subscriber
still gets its ``310 ACK``. While the database does not have the ACK, no session of the
account is offered the message again; after ``kill -9`` of the listener and its storage
processes the journal is the ACK's only record, and a new listener (or the Celery sweep, for
a listener that does not come back) applies it: the message is never delivered again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import fresh_database, listener, query_database, run_manage
from tests.e2e.smqp.test_storage import gone, storage_pids, wait_for
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SETUP = """
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
for name in ['root', 'bob']:
    a = Account(username=name, is_superuser=name == 'root', is_staff=name == 'root')
    a.set_password('pw')
    a.save()
j = Topic.objects.create(path='/j')
UALEntry.objects.create(topic=j, principal_kind='account',
                        account=Account.objects.get(username='bob'), right='subscribe')
"""


def delivery_state(env: dict[str, str], smuid: int) -> str:
    """bob's delivery state of a message, read from the database itself."""
    [(state,)] = query_database(
        env, "SELECT d.state FROM broker_delivery d JOIN accounts_account a"
             " ON a.id = d.account_id WHERE a.username = %s AND d.message_id = %s",
        ("bob", smuid))
    return state


def journal_files(var: Path) -> list[Path]:
    return sorted((var / "ack-journal").glob("*/*.acks"))


def smuid_in(note) -> int:
    return int(header(note, "Smuid").rsplit("/", 1)[1])


@contextmanager
def subscribed_bob(broker) -> Iterator[Session]:
    """bob, logged in and subscribed to /j."""
    with Session(broker.host, broker.port, "bob") as bob:
        assert bob.command("SUB MESSAGE /j").code == 200
        yield bob


def deliver_one(broker, bob: Session, body: str) -> int:
    with Session(broker.host, broker.port, "root") as root:
        smuid = smuid_of(root.publish("/j", body))
    assert smuid_in(bob.message()) == smuid
    return smuid


@pytest.mark.parametrize("recovered_by", ["restart", "celery task"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_ack_in_the_journal_only_is_never_delivered_again(backend, recovered_by, tmp_path):
    with fresh_database(backend, tmp_path, setup=SETUP) as env:
        with listener(env, tmp_path, name="j1") as broker:
            with subscribed_bob(broker) as bob:
                smuid = deliver_one(broker, bob, "first")
                storage = storage_pids(broker.proc.pid)
                assert storage
                for pid in storage:  # nothing reaches the database from here on
                    os.kill(pid, signal.SIGSTOP)
                bob.ack()  # answered all the same: the ACK is journaled
                assert len(journal_files(tmp_path)) == 1
                # A session that logs in now reads the message from the store as waiting
                # (its ACK is not there yet), and must not be offered it.
                with Session(broker.host, broker.port, "bob") as again:
                    assert again.quiet(1.5)
                    assert again.command("NOOP").code == 200
            for pid in [broker.proc.pid, *storage]:
                os.kill(pid, signal.SIGKILL)
            broker.proc.wait(timeout=scaled(10))
            assert wait_for(lambda: all(gone(pid) for pid in storage))
        # The journal is the ACK's only record now.
        assert delivery_state(env, smuid) != "acked"
        if recovered_by == "celery task":
            out = run_manage(env, "shell", "--no-imports", "-c",
                             "from broker.tasks import recover_ack_journals\n"
                             "print(recover_ack_journals())")
            assert out.stdout.strip() == "1"
        with listener(env, tmp_path, name="j2") as broker:
            recovered = "Recovered 1 ACK(s)" in broker.log()
            assert recovered == (recovered_by == "restart"), broker.log()
            assert delivery_state(env, smuid) == "acked"
            with Session(broker.host, broker.port, "bob") as bob:
                assert bob.quiet(1.5)  # the ACKed message does not come back
                later = deliver_one(broker, bob, "second")
                assert later > smuid
                bob.ack()
        # A clean stop applies what was journaled and leaves no journal behind.
        assert journal_files(tmp_path) == []
        assert delivery_state(env, later) == "acked"


@pytest.mark.parametrize("settings", [{"SMQP_ACK_JOURNAL": "0"},
                                      {"SMQP_ACK_DURABILITY": "full"}],
                         ids=["no journal", "journal flushed"])
def test_other_ack_settings_deliver_once(settings, tmp_path):
    """Without the journal (310 ACK after the commit), and with the journal flushed before
    310 ACK: delivered once, never again after a re-login or kill -9."""
    with fresh_database("sqlite", tmp_path, settings, setup=SETUP) as env:
        with listener(env, tmp_path, name="k1") as broker:
            with subscribed_bob(broker) as bob:
                first = deliver_one(broker, bob, "one")
                bob.ack()
                second = deliver_one(broker, bob, "two")
                bob.ack()
                assert len(journal_files(tmp_path)) == (0 if "SMQP_ACK_JOURNAL" in settings
                                                        else 1)
            with Session(broker.host, broker.port, "bob") as bob:
                assert bob.quiet(1.0)
            broker.proc.send_signal(signal.SIGKILL)
            broker.proc.wait(timeout=scaled(10))
        with listener(env, tmp_path, name="k2") as broker, \
                Session(broker.host, broker.port, "bob") as bob:
            assert bob.quiet(1.0)
        assert delivery_state(env, first) == delivery_state(env, second) == "acked"
