"""A PostgreSQL storage process's connection between calls
(:meth:`broker.store.backends.postgresql.PostgreSQL.before_storage_call`): no health-check
round trip before each call; a connection the server ended while it sat idle is replaced
before the next call uses it, and a working one is kept.

Run in a ``manage.py shell`` of its own on a fresh database, set up as a storage process
sets up its connection (``open_for_storage``). The server's end of the connection is
ended with ``pg_terminate_backend`` from another connection, as a restart would."""

from __future__ import annotations

import json

from tests.conftest import fresh_database, run_manage
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
