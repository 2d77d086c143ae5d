"""A PostgreSQL storage process's connection between calls
(:meth:`broker.store.backends.postgresql.PostgreSQL.before_storage_call`): no health-check
round trip before each call; a connection the server ended while it sat idle is replaced
before the next call uses it, and a working one is kept.

Run in a ``manage.py shell`` of its own on a fresh database, set up as a storage process
sets up its connection (``open_for_storage``). The server's end of the connection is
ended with ``pg_terminate_backend`` from another connection, as a restart would."""

from __future__ import annotations

import json

from tests.conftest import accounts_script, fresh_database, run_manage
from tests.support.timing import scaled

SCRIPT = r"""
import json, select, time
import psycopg
from django.db import connection
from broker.store.backends import backend

DEADLINE = time.monotonic() + %(wait)s
store = backend()
store.open_for_storage(connection.settings_dict["NAME"])

def server_pid():
    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()")
        return c.fetchone()[0]

out = {}
first = server_pid()
out["health_checks"] = connection.health_check_enabled
raw = connection.connection
store.before_storage_call()
out["kept"] = connection.connection is raw and server_pid() == first

params = connection.get_connection_params()
admin = psycopg.connect(host=params.get("host"), port=params.get("port"),
                        user=params.get("user"), dbname="postgres", autocommit=True)
admin.execute("SELECT pg_terminate_backend(%%s)", (first,))
# The server has ended it once its goodbye is on the socket.
while not select.select([raw.fileno()], [], [], 0.05)[0] and time.monotonic() < DEADLINE:
    pass
store.before_storage_call()
out["dropped"] = connection.connection is None
second = server_pid()
out["replaced"] = second not in (None, first)
print("RESULT " + json.dumps(out))
"""


def test_a_connection_ended_by_the_server_is_replaced_and_a_working_one_kept(tmp_path):
    with fresh_database("postgres", tmp_path) as env:
        result = run_manage(env, "shell", "--no-imports", "-c", SCRIPT % {"wait": scaled(10)})
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out == {"health_checks": False, "kept": True, "dropped": True, "replaced": True}


# A publish batch and an ACK batch, each the first call after the server ended the
# connection, with the server's goodbye not yet on the socket when the call starts (as when
# pg_terminate_backend has returned and the backend not yet ended: the look at the socket is
# made to see nothing). Each first reads an access snapshot, before its transaction: that
# read meets the broken connection, which committed nothing, and the call runs again on a
# new one (broker.store.rows.reads_before_writing).
RACE_SCRIPT = r"""
import json, types
import psycopg
from django.db import connection
from broker.services.ack import AckRequest
from broker.services.prepare import PublishRequest
from broker.services.publish import Published
from broker.services.storage_calls import CALLS
from broker.services import subscriptions
from broker.services.topics import create_topic
from broker.smqp.message import DataSection, Message
from broker.smqp.values import TopicPattern
from broker.store import dbthread
from broker.store.backends import backend, postgresql
from ual import resolution
from ual.resolution import AccessSnapshot

root = Account.objects.get(username="root")
create_topic(AccessSnapshot(root), "/cut")
subscriptions.subscribe(AccessSnapshot(root), "MESSAGE", TopicPattern(base="/cut", wildcard=False))
store = backend()
store.open_for_storage(connection.settings_dict["NAME"])
postgresql.select = types.SimpleNamespace(select=lambda *args: ([], [], []))
params = connection.get_connection_params()
admin = psycopg.connect(host=params.get("host"), port=params.get("port"),
                        user=params.get("user"), dbname="postgres", autocommit=True)

def cut():
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    resolution.invalidate_local()  # the next call reads its snapshot
    # With a timeout, pg_terminate_backend returns once the backend has ended.
    admin.execute("SELECT pg_terminate_backend(%%s, %%s)", (pid, %(wait_ms)s))
    store.before_storage_call()
    return pid

out = {}
first = cut()
message = Message([], [DataSection([("Content-Type", "text/plain")], b"after the cut")])
request = PublishRequest(account_id=root.pk, guid="cut00001", kind="MESSAGE", topic="/cut",
                         cmuid="c1", message=message)
[published] = dbthread.call_here(CALLS["publish_batch"], [request])
out["published"] = isinstance(published, Published)
out["new_connection"] = connection.connection.info.backend_pid != first
cut()
acked = dbthread.call_here(CALLS["ack_batch"],
                           [AckRequest(root.pk, published.smuid, 1, receipt=False)])
out["ack_answer"] = acked
with connection.cursor() as c:
    c.execute("SELECT state FROM broker_delivery WHERE message_id = %%s", [published.smuid])
    out["states"] = [state for state, in c.fetchall()]
print("RESULT " + json.dumps(out))
"""


def test_a_batch_whose_first_read_meets_the_ended_connection_runs_again_on_a_new_one(tmp_path):
    with fresh_database("postgres", tmp_path) as env:
        result = run_manage(env, "shell", "--no-imports", "-c", accounts_script("root")
                            + RACE_SCRIPT % {"wait_ms": int(scaled(10) * 1000)})
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out == {"published": True, "new_connection": True, "ack_answer": [],
                   "states": ["acked"]}
