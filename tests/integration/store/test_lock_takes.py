"""Queue-mode lock takes on PostgreSQL (:func:`broker.store.messages.lock_deliveries`) meet
a row another transaction holds: a competing taker's, in another listener's settle batch not
committed yet. The take must pass that row by at once (it is the other taker's) and still
take the others; it must neither wait for the other transaction nor fail with it. Once the
other transaction ends, the row is decided on what it committed: taken if it was let go,
refused if the other taker's lock stands. SQLite has one writer: no such meeting there.

Run in a ``manage.py shell`` of its own on a fresh database (as the listener's database
thread runs it), with a second connection playing the competing taker. ``lock_timeout``
turns a take that would wait into an error, so nothing here depends on timing.
"""

from __future__ import annotations

import json

from tests.conftest import fresh_database, run_manage

SCRIPT = r"""
import json, os
from datetime import timedelta
import psycopg
from django.db import connection
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message
from broker.store import messages as stored
from broker.store.rows import hot_transaction
from topics.models import Topic

out = {}
account = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/q", delivery_mode="queue", retry_timeout=30,
                             max_retries=5, expiry_timeout=60)
smuids = []
for i in range(3):
    m = Message.objects.create(topic=topic, cmuid=f"c{i}", created=timezone.now(), timeout=60)
    Delivery.objects.create(account=account, message=m)
    smuids.append(m.pk)
table = Delivery._meta.db_table

with connection.cursor() as cursor:
    cursor.execute("SET lock_timeout = '3s'")  # a take that waits fails instead

def take(holder, which):
    now = timezone.now()
    try:
        with hot_transaction(relaxed=True):
            rows = stored.lock_deliveries(account.pk, holder, which, now,
                                          now + timedelta(seconds=30), 5)()
        return sorted(int(r[0]) for r in rows)
    except Exception as exc:
        return type(exc).__name__

other = psycopg.connect(os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1))

# 1. The other taker holds the first row (its transaction still open): this take passes it
#    by and takes the other two.
other.execute(f"SELECT id FROM {table} WHERE message_id = %s FOR UPDATE", [smuids[0]])
out["while_held"] = take("h1", smuids)
# 2. It let go (rolled back): the row is free to take.
other.rollback()
out["after_rollback"] = take("h1", [smuids[0]])

# 3. The other taker locks a row to its own holder and has not committed: passed by here;
#    once it committed, its lock stands and this take is refused (exactly one winner).
Delivery.objects.filter(message_id=smuids[1]).update(state="pending", holder="",
                                                     next_attempt=None)
other.execute(f"UPDATE {table} SET state = 'notified', holder = 'h2', "
              f"next_attempt = now() + interval '30 seconds', attempts = attempts + 1 "
              f"WHERE message_id = %s", [smuids[1]])
out["while_taking"] = take("h1", [smuids[1]])
other.commit()
out["after_commit"] = take("h1", [smuids[1]])
out["holders"] = {str(m): h for m, h in Delivery.objects.filter(message_id__in=smuids)
                  .values_list("message_id", "holder")}
out["smuids"] = smuids
other.close()
print("RESULT " + json.dumps(out))
"""


def test_a_take_passes_by_a_row_another_taker_holds_on_postgresql(tmp_path):
    with fresh_database("postgres", tmp_path) as env:
        result = run_manage(env, "shell", "--no-imports", "-c", SCRIPT)
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    first, second, third = out["smuids"]
    assert out["while_held"] == [second, third]  # not LockNotAvailable, not [all three]
    assert out["after_rollback"] == [first]
    assert out["while_taking"] == []
    assert out["after_commit"] == []
    assert out["holders"] == {str(first): "h1", str(second): "h2", str(third): "h1"}

