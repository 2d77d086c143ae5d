"""The storage process keeps the planner's statistics of the message and delivery tables
(:meth:`broker.store.backends.postgresql.PostgreSQL.keep_statistics`): after a burst of
publishes into a table autovacuum has not analyzed yet, it ANALYZEs both; after a few
changes, neither. Without it, PostgreSQL estimated one row for the REST pull's candidates
and joined each pending delivery to every pending message of its topic (6 s for 3,500).

Run in a ``manage.py shell`` of its own on a fresh database, as a storage process runs it.
PostgreSQL's activity counters reach shared memory when a backend goes idle: the script
waits for them (``pg_stat_force_next_flush``), not for a fixed time."""

from __future__ import annotations

import json

from tests.conftest import fresh_database, run_manage
from tests.support.timing import scaled

SCRIPT = r"""
import json, time
from django.db import connection
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message
from broker.store.backends import backend
from broker.store.backends import postgresql
from topics.models import Topic

DEADLINE = time.monotonic() + %(wait)s
account = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/q", delivery_mode="queue", retry_timeout=30,
                             max_retries=5, expiry_timeout=60)

def burst(n, start):
    now = timezone.now()
    messages = Message.objects.bulk_create(
        Message(topic=topic, cmuid=f"c{start + i}", created=now, timeout=60) for i in range(n))
    Delivery.objects.bulk_create(Delivery(account=account, message=m) for m in messages)

def changes():
    with connection.cursor() as c:
        c.execute("SELECT relname, n_mod_since_analyze, last_analyze IS NOT NULL "
                  "FROM pg_stat_user_tables WHERE relname IN (%%s, %%s)",
                  [Message._meta.db_table, Delivery._meta.db_table])
        return {name: (n, analyzed) for name, n, analyzed in c.fetchall()}

def counted(at_least):
    # The counters of this backend's inserts, once flushed to shared memory.
    while True:
        with connection.cursor() as c:
            c.execute("SELECT pg_stat_force_next_flush()")
        seen = changes()
        if all(n >= at_least for n, _ in seen.values()) or time.monotonic() > DEADLINE:
            return seen

def keep():
    postgresql._next_look = 0.0  # (a look is due)
    backend().keep_statistics()
    postgresql.analyzed(DEADLINE - time.monotonic())  # the ANALYZE runs on a thread
    return changes()

out = {}
burst(20, 0)
out["few_before"] = counted(20)
out["few_after"] = keep()
burst(1000, 20)
out["burst_before"] = counted(1020)
out["burst_after"] = keep()
print("RESULT " + json.dumps(out))
"""


def test_a_burst_of_publishes_gets_its_tables_analyzed_and_a_few_do_not(tmp_path):
    with fresh_database("postgres", tmp_path) as env:
        result = run_manage(env, "shell", "--no-imports", "-c",
                            SCRIPT % {"wait": scaled(30)})
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    tables = ("broker_message", "broker_delivery")
    # 20 changed rows: below the threshold, nothing analyzed.
    assert all(out["few_before"][t][0] >= 20 for t in tables)
    assert all(out["few_after"][t] == out["few_before"][t] for t in tables)
    assert not any(out["few_after"][t][1] for t in tables)
    # 1,020: both analyzed, their change counts back to zero.
    assert all(out["burst_before"][t][0] >= 1020 for t in tables)
    assert all(out["burst_after"][t] == [0, True] for t in tables)


BESIDE = r"""
import json, time
import psycopg
from django.db import connection
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message
from broker.store.backends import backend
from broker.store.backends import postgresql
from topics.models import Topic

account = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/q", delivery_mode="queue", retry_timeout=30,
                             max_retries=5, expiry_timeout=60)
now = timezone.now()
messages = Message.objects.bulk_create(
    Message(topic=topic, cmuid=f"c{i}", created=now, timeout=60) for i in range(1000))
Delivery.objects.bulk_create(Delivery(account=account, message=m) for m in messages)
deadline = time.monotonic() + %(wait)s
while time.monotonic() < deadline:
    with connection.cursor() as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        c.execute("SELECT min(n_mod_since_analyze) FROM pg_stat_user_tables "
                  "WHERE relname IN ('broker_message', 'broker_delivery')")
        if c.fetchone()[0] >= 1000:
            break

# Another session holds what ANALYZE needs (SHARE UPDATE EXCLUSIVE): the ANALYZE waits.
params = connection.get_connection_params()
other = psycopg.connect(host=params.get("host"), port=params.get("port"),
                        user=params.get("user"), dbname=connection.settings_dict["NAME"])
other.execute("LOCK TABLE broker_message IN SHARE UPDATE EXCLUSIVE MODE")
with connection.cursor() as c:  # (an ANALYZE on this connection would fail, not hang)
    c.execute("SET lock_timeout = '%(lock)ss'")
postgresql._next_look = 0.0
backend().keep_statistics()  # returns while the ANALYZE waits on its own connection
out = {"waiting": postgresql._analyzing is not None and postgresql._analyzing.is_alive()}
with connection.cursor() as c:  # this connection serves meanwhile
    c.execute("SELECT count(*) FROM broker_message")
    out["served"] = c.fetchone()[0]
other.rollback()
postgresql.analyzed(%(wait)s)
with connection.cursor() as c:
    c.execute("SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
              "WHERE relname IN ('broker_message', 'broker_delivery') ORDER BY relname")
    out["analyzed"] = dict(c.fetchall())
print("RESULT " + json.dumps(out))
"""


def test_the_analyze_runs_beside_the_storage_calls(tmp_path):
    # The publishes a storage process is sent wait for nothing but their own statements:
    # with the ANALYZE held up by another session's lock, keep_statistics() has returned and
    # the process's connection answers; once the lock goes, both tables are analyzed.
    with fresh_database("postgres", tmp_path) as env:
        script = BESIDE % {"wait": scaled(30), "lock": round(scaled(10))}
        result = run_manage(env, "shell", "--no-imports", "-c", script)
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT ")) == {
        "waiting": True, "served": 1000,
        "analyzed": {"broker_delivery": True, "broker_message": True}}
