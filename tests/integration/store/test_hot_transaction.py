"""``rows.hot_transaction`` and ``rows.query`` on a real database of each backend.

On PostgreSQL the transaction runs in pipeline mode with a BEGIN and COMMIT of its own, so
its error paths differ from Django's ``atomic()``: a failing statement surfaces at a later
read or at the COMMIT. These run in a ``manage.py shell`` of their own, on a fresh database,
outside any test transaction (the way the listener's database thread runs them).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import fresh_database, run_manage
from tests.support.timing import scaled

# Shared by the scripts below: an INSERT of a usage event of a given kind, and a count.
PRELUDE = r"""
import json
from django.db import connection
from broker.models import UsageEvent

out = {}
table = UsageEvent._meta.db_table
ph = "?" if connection.vendor == "sqlite" else "%s"
insert = (f"INSERT INTO {table} (at, kind, account, topic, bytes, peer, detail) "
          f"VALUES (CURRENT_TIMESTAMP, {ph}, {ph}, '', 0, '', '{{}}')")

def count(kind):
    return UsageEvent.objects.filter(kind=kind).count()
"""

SCRIPT = PRELUDE + r"""
from django.db import IntegrityError, transaction
from broker.models import DataSection
from broker.store.rows import hot_transaction, query, raw_cursor

hooks = []

# 1. Commit: the rows are there, the on_commit hook ran after the COMMIT, a query's rows
#    are read after later statements were sent.
with hot_transaction(relaxed=True):
    with raw_cursor() as cursor:
        cursor.execute(insert, ["one", ""])
    rows = query(f"SELECT kind FROM {table} WHERE kind = {ph}", ["one"])
    with raw_cursor() as cursor:
        cursor.execute(insert, ["one", ""])
    transaction.on_commit(lambda: hooks.append(("committed", count("one"))))
    out["hooks_inside"] = list(hooks)
    out["read_later"] = [r[0] for r in rows()]
out["hooks_after"] = hooks[:]
out["after_commit"] = count("one")

# 2. A statement that fails only at the COMMIT (a deferred foreign key on PostgreSQL; at
#    once on SQLite): the error reaches the caller, nothing of the transaction stays, the
#    hook never runs, and the connection works afterwards.
hooks.clear()
try:
    with hot_transaction():
        with raw_cursor() as cursor:
            cursor.execute(insert, ["two", ""])
        DataSection.objects.create(message_id=987654321, position=0, content_type="x",
                                   content_length=0, body=b"")
        transaction.on_commit(lambda: hooks.append("never"))
    out["failure"] = None
except IntegrityError as exc:
    out["failure"] = type(exc).__name__
out["after_failure"] = count("two")
out["hooks_after_failure"] = hooks[:]

# 3. An error raised by the code inside: rolled back as well.
try:
    with hot_transaction():
        with raw_cursor() as cursor:
            cursor.execute(insert, ["three", ""])
        raise ValueError("boom")
except ValueError:
    pass
out["after_raise"] = count("three")

# 4. An atomic() inside (bulk_create opens one) joins the transaction; the connection is
#    back in autocommit afterwards, outside any atomic block.
with hot_transaction():
    UsageEvent.objects.bulk_create([UsageEvent(kind="four"), UsageEvent(kind="four")])
out["nested_atomic"] = count("four")
out["autocommit"] = connection.get_autocommit()
out["in_atomic_block"] = connection.in_atomic_block
out["hooks_at_end"] = hooks[:]  # the failed transaction's hook never ran, not even later
print("RESULT " + json.dumps(out))
"""


def shell_result(env: dict[str, str], script: str):
    """Run ``script`` in a ``manage.py shell`` of its own; what it printed after ``RESULT``
    (JSON)."""
    result = run_manage(env, "shell", "--no-imports", "-c", script)
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    with fresh_database(request.param, tmp_path) as env:
        yield env


def test_hot_transaction_commits_rolls_back_and_runs_hooks_after_commit(database):
    out = shell_result(database, SCRIPT)
    assert out["hooks_inside"] == []
    assert out["read_later"] == ["one"]
    assert out["hooks_after"] == [["committed", 2]]
    assert out["after_commit"] == 2
    assert out["failure"] == "IntegrityError"
    assert out["after_failure"] == 0
    assert out["hooks_after_failure"] == []
    assert out["after_raise"] == 0
    assert out["nested_atomic"] == 2
    assert out["autocommit"] is True
    assert out["in_atomic_block"] is False
    assert out["hooks_at_end"] == []


INSERT_SCRIPT = r"""
import json
from datetime import UTC, datetime
from broker.models import DataSection, Message, UsageEvent
from broker.store import rows
from topics.models import Topic

topic = Topic.objects.create(path="/rows")
when = datetime(2026, 11, 22, 12, 30, 15, 123456, tzinfo=UTC)
messages = rows.Table(Message, ("topic", "publisher", "publisher_guid", "cmuid", "name",
                                "priority", "created", "received", "timeout", "expires",
                                "depth", "sequence", "receipt", "reply", "in_reply_to",
                                "headers", "size", "state", "trashed"))
sections = rows.Table(DataSection, ("message", "position", "content_type", "content_length",
                                    "content_encoding", "headers", "body"))
events = rows.Table(UsageEvent, ("at", "kind", "account", "topic", "smuid", "bytes", "peer",
                                 "detail"))

def message(i, priority=None):
    # Columns that are NULL in every row of a batch (publisher, in_reply_to, trashed) too.
    return (topic.pk, None, "guid", f"c{i}", f"n{i}", priority, rows.db_datetime(when),
            rows.db_datetime(when), -1 if i else None, None, 0, None, bool(i % 2), False,
            None, rows.db_json([["Name", f"n{i}"], ["X-Quote", "it's \"quoted\""]]), 3,
            "pending", None)

out = {}
with rows.hot_transaction():
    three = messages.insert_returning_pks([message(0), message(1, 5), message(2)])
    one = messages.insert_returning_pks([message(3)])
    sections.insert([(pk, 0, "application/octet-stream", 3, "", rows.db_json([]),
                      bytes([0, 255, i])) for i, pk in enumerate(three)])
    events.insert([(rows.db_datetime(when), "publish", "bob", "/rows", pk, 3, "",
                    rows.db_json({"k": [1, None]})) for pk in three + one])
    events.insert([(rows.db_datetime(when), "ack", "", "", None, 0, "", rows.db_json({}))])
out["pks"] = three + one
out["messages"] = [
    [m.pk, m.cmuid, m.priority, m.timeout, m.receipt, m.publisher_id, m.in_reply_to_id,
     m.created.isoformat(), m.headers]
    for m in Message.objects.filter(pk__in=three + one).order_by("pk")]
out["bodies"] = [list(bytes(s.body)) for s in DataSection.objects.order_by("message_id")]
out["details"] = [[e.smuid, e.detail, e.at.isoformat()]
                  for e in UsageEvent.objects.order_by("pk")]
print("RESULT " + json.dumps(out))
"""


def test_table_inserts_write_what_the_orm_reads_back(database):
    """:class:`rows.Table` (PostgreSQL: one unnest INSERT per batch, binary arrays; SQLite:
    executemany) stores NULL-only columns, JSON, bytes and datetimes as the ORM reads them,
    with keys ascending in row order."""
    out = shell_result(database, INSERT_SCRIPT)
    pks = out["pks"]
    assert pks == sorted(pks) and len(set(pks)) == 4
    when = "2026-11-22T12:30:15.123456+00:00"
    assert out["messages"] == [
        [pks[0], "c0", None, None, False, None, None, when,
         [["Name", "n0"], ["X-Quote", "it's \"quoted\""]]],
        [pks[1], "c1", 5, -1, True, None, None, when,
         [["Name", "n1"], ["X-Quote", "it's \"quoted\""]]],
        [pks[2], "c2", None, -1, False, None, None, when,
         [["Name", "n2"], ["X-Quote", "it's \"quoted\""]]],
        [pks[3], "c3", None, -1, True, None, None, when,
         [["Name", "n3"], ["X-Quote", "it's \"quoted\""]]],
    ]
    assert out["bodies"] == [[0, 255, 0], [0, 255, 1], [0, 255, 2]]
    assert out["details"] == [[pk, {"k": [1, None]}, when] for pk in pks] + [[None, {}, when]]


GROUP_SCRIPT = r"""
import json
import sqlite3
from datetime import UTC, datetime
from django.db import IntegrityError, connection
from broker.models import DataSection, Message, UsageEvent
from broker.store import rows
from topics.models import Topic

if connection.vendor == "postgresql":  # prepared from the first run, as in a storage process
    connection.close()
    connection.settings_dict.setdefault("OPTIONS", {})["prepare_threshold"] = 0
topic = Topic.objects.create(path="/group")
when = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
messages = rows.Table(Message, ("topic", "publisher_guid", "cmuid", "name", "created",
                                "received", "depth", "receipt", "reply", "headers", "size",
                                "state"))
sections = rows.Table(DataSection, ("message", "position", "content_type", "content_length",
                                    "content_encoding", "headers", "body"))
events = rows.Table(UsageEvent, ("at", "kind", "account", "topic", "smuid", "bytes", "peer",
                                 "detail"))
at = rows.db_datetime(when)

def batch(n, *, orphan=False):
    group = rows.Inserts()
    reserved = messages.reserve_pks(n)
    pks = messages.insert_returning_pks(
        [(topic.pk, "g", f"c{i}", "", at, at, 0, False, False, rows.db_json([]), 1, "pending")
         for i in range(n)], reserved, group)
    # Sections first on purpose: the parts go as one statement, its keys checked at COMMIT.
    target = [987654321] * n if orphan else pks
    group.add(sections, [(pk, i, "text/plain", 1, "", rows.db_json([]), b"x")
                         for i, pk in enumerate(target)])
    events.insert([(at, "publish", "bob", "/group", pk, 1, "", "{}") for pk in pks], group)
    group.run()
    return pks

out = {"batches": []}
for n in (1, 3, 1):  # the same statement again (prepared), and another shape of arrays
    with rows.hot_transaction():
        out["batches"].append(batch(n))
try:
    with rows.hot_transaction():
        batch(2, orphan=True)
    out["orphan"] = None
except (IntegrityError, sqlite3.IntegrityError) as exc:  # SQLite's at COMMIT, not wrapped
    out["orphan"] = type(exc).__name__
out["messages"] = sorted(Message.objects.values_list("pk", flat=True))
out["sections"] = sorted(DataSection.objects.values_list("message_id", flat=True))
out["events"] = sorted(UsageEvent.objects.values_list("smuid", flat=True))
print("RESULT " + json.dumps(out))
"""


def test_grouped_inserts_commit_together_or_not_at_all(database):
    """:class:`rows.Inserts` (PostgreSQL: one statement of data-modifying WITH clauses,
    prepared; SQLite: an executemany per part): the parts of a batch are stored together in
    any order, and a part that breaks a foreign key takes the whole transaction back."""
    out = shell_result(database, GROUP_SCRIPT)
    stored = [pk for pks in out["batches"] for pk in pks]
    assert [len(pks) for pks in out["batches"]] == [1, 3, 1]
    assert out["orphan"] == "IntegrityError"
    assert out["messages"] == stored
    assert out["sections"] == stored
    assert out["events"] == stored


HELD_SCRIPT = r"""
import json
from accounts.models import Account
from broker.services import storage_calls as storage
from broker.models import Message
from broker.services.publish import PublishRequest, publish_batch_held
from broker.smqp.message import DataSection
from broker.smqp.message import Message as Wire
from topics.models import Topic

root = Account.objects.create(username="root", is_superuser=True)
Topic.objects.create(path="/held")

def requests(*cmuids):
    return [PublishRequest(root.pk, "g", "MESSAGE", "/held", cmuid,
                           Wire([], [DataSection([("Content-Type", "text/plain")], b"x")]))
            for cmuid in cmuids]

def stored():
    return sorted(Message.objects.values_list("cmuid", flat=True))

out = {}
# The storage process's two calls: the batch is stored at the commit.
results = storage._publish_begin(requests("a1", "a2"))
out["smuids"] = [r.smuid for r in results]
out["headers_only"] = all(isinstance(r.payload[2], list) for r in results)
storage._publish_commit()
out["after_commit"] = stored()
# A batch held and never committed (its listener gave up) is rolled back by the next one.
storage._publish_begin(requests("b1"))
storage._publish_begin(requests("c1"))
storage._publish_commit()
out["after_abandon"] = stored()
try:
    storage._publish_commit()  # nothing held
    out["commit_without_begin"] = None
except RuntimeError as exc:
    out["commit_without_begin"] = str(exc)
# The services' generator closed instead of resumed: rolled back, the connection usable.
held = publish_batch_held(requests("d1"))
next(held)
held.close()
out["after_close"] = stored()
# A whole batch (begun and committed in one call) after one held: that one is rolled back.
storage._publish_begin(requests("e1"))
storage._publish_batch(requests("f1"))
out["after_whole"] = stored()
print("RESULT " + json.dumps(out))
"""


def test_a_held_publish_batch_commits_when_told_and_only_then(database):
    """The storage process's ``publish_begin`` / ``publish_commit`` (PostgreSQL's two
    publish lanes): the batch is stored at the commit; one held and never committed is
    rolled back when the next begins; a commit with nothing held fails."""
    out = shell_result(database, HELD_SCRIPT)
    assert out["smuids"] == sorted(out["smuids"]) and len(set(out["smuids"])) == 2
    assert out["headers_only"] is True
    assert out["after_commit"] == ["a1", "a2"]
    assert out["after_abandon"] == ["a1", "a2", "c1"]
    assert "nothing committed" in out["commit_without_begin"]
    assert out["after_close"] == ["a1", "a2", "c1"]
    assert out["after_whole"] == ["a1", "a2", "c1", "f1"]


RACE_SCRIPT = r"""
import json
import threading
import time
from django.db import connection, transaction
from accounts.models import Account
from broker.models import Delivery
from broker.services import subscriptions
from broker.services.publish import PublishRequest, publish_batch
from broker.smqp.message import DataSection
from broker.smqp.message import Message as Wire
from broker.smqp.values import parse_topic_pattern
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import snapshot_for

root = Account.objects.create(username="root", is_superuser=True)
bob = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/race")
UALEntry.objects.create(topic=topic, principal_kind="account", account=bob, right="subscribe")
subscribing, may_commit, published = threading.Event(), threading.Event(), threading.Event()
out = {}

def subscribe():
    try:
        with transaction.atomic():  # the SUB's transaction, held open a moment
            subscriptions.subscribe(snapshot_for(bob), "MESSAGE", parse_topic_pattern("/race"))
            subscribing.set()
            may_commit.wait(20)
    finally:
        connection.close()

# REPUBLISH brings a message back from Trash to the topic's subscribers: the same race.
from django.utils import timezone
from broker.models import Message
from broker.services.publish import republish
trashed = Message.objects.create(topic=topic, cmuid="old", created=timezone.now(),
                                 state="trash", trashed=timezone.now())

def publish():
    try:
        if ACTION == "republish":
            result = republish(snapshot_for(root), "/race/Trash", trashed.pk)
        else:
            [result] = publish_batch([PublishRequest(
                root.pk, "g", "MESSAGE", "/race", "r1",
                Wire([], [DataSection([("Content-Type", "text/plain")], b"x")]))])
        out["smuid"] = result.smuid
        out["accounts"] = result.accounts
        published.set()
    finally:
        connection.close()

s = threading.Thread(target=subscribe)
s.start()
assert subscribing.wait(20)
p = threading.Thread(target=publish)
p.start()
time.sleep(WINDOW)  # a quiet window: the publish must not get through meanwhile
out["published_before_the_sub_committed"] = published.is_set()
may_commit.set()
s.join(20)
p.join(20)
out["delivery"] = Delivery.objects.filter(account=bob, message_id=out["smuid"]).exists()
out["bob"] = bob.pk
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("action", ["publish", "republish"])
def test_a_publish_and_a_subscription_made_at_once_never_miss_each_other(database, action):
    """A SUB MESSAGE whose transaction is still open while a PUB (or a REPUBLISH) to its
    topic runs: the publish waits for it (PostgreSQL: advisory topic locks, shared for
    publishes, exclusive for a new subscription's backlog; SQLite: its one writer) and then
    delivers to the new subscriber. Without the locks, on PostgreSQL (READ COMMITTED), the
    publish read the subscriptions before the SUB committed and the SUB read the messages
    before the publish committed: the message reached neither."""
    script = f"ACTION = {action!r}\nWINDOW = {scaled(0.5)!r}\n" + RACE_SCRIPT
    out = shell_result(database, script)
    assert out["published_before_the_sub_committed"] is False
    assert out["accounts"] == [out["bob"]]
    assert out["delivery"] is True


ACK_SCRIPT = r"""
import json
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message, UsageEvent
from broker.services.ack import AckRequest, ack_batch
from topics.models import Topic

bob = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/acks")
now = timezone.now()
held, backlog, other = (Message.objects.create(topic=topic, cmuid=f"m{i}", created=now,
                                               timeout=60) for i in range(3))
Delivery.objects.create(account=bob, message=held)
Delivery.objects.create(account=bob, message=other)
# The same pair twice in one batch (two sessions of the account), a message with no row
# yet (it came from a backlog), and no receipt wanted: PostgreSQL's one-statement path.
assert ack_batch([AckRequest(bob.pk, held.pk, 1, False), AckRequest(bob.pk, held.pk, 2, False),
                  AckRequest(bob.pk, backlog.pk, 1, False)]) == []
first = {d.message_id: (d.state, d.attempts, d.acked)
         for d in Delivery.objects.filter(account=bob)}
# Again, later: the rows ACKed before stay as they were.
assert ack_batch([AckRequest(bob.pk, held.pk, 3, False)]) == []
again = Delivery.objects.get(account=bob, message=held)
out = {
    "states": sorted((m, s, a) for m, (s, a, _) in first.items()),
    "unchanged": [again.state, again.attempts, again.acked == first[held.pk][2]],
    "expires": sorted((m.pk, m.expires is not None)
                      for m in Message.objects.filter(topic=topic)),
    "events": UsageEvent.objects.filter(kind="ack").count(),
    "ids": [held.pk, backlog.pk, other.pk],
}
print("RESULT " + json.dumps(out))
"""


def test_an_ack_batch_records_first_acks_once_and_starts_timeouts(database):
    """:func:`ack_batch` on each backend (PostgreSQL: one upsert for the whole batch): a pair
    ACKed twice in one batch is recorded once, a message with no delivery row gets one (with
    the first ACK's attempt count), a later ACK changes nothing, and the timeout starts for the
    messages every subscriber has ACKed."""
    out = shell_result(database, ACK_SCRIPT)
    held, backlog, other = out["ids"]
    # A row that existed keeps its attempt count (the retries' count); a new one is made
    # with the first ACK's.
    assert out["states"] == [[held, "acked", 0], [backlog, "acked", 1], [other, "pending", 0]]
    assert out["unchanged"] == ["acked", 0, True]
    assert out["expires"] == [[held, True], [backlog, True], [other, False]]
    assert out["events"] == 4


PLAN_SCRIPT = r"""
import json
from django.db import connection
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message
from broker.store.backends.postgresql import finish_statements as _finish_statements
from topics.models import Topic

bob = Account.objects.create(username="bob")
topic = Topic.objects.create(path="/plans")
now = timezone.now()
Message.objects.bulk_create(
    Message(topic=topic, cmuid=f"m{i}", created=now, timeout=60, state="trash", expires=now)
    for i in range(5000))
ids = list(Message.objects.order_by("pk").values_list("pk", flat=True))
Delivery.objects.bulk_create(Delivery(account=bob, message_id=pk, state="acked") for pk in ids)
with connection.cursor() as cursor:
    # Statistics that say nothing waits and every message has its expiry; then the
    # opposite becomes true (a queue table's life: all trashed, then a burst arrives).
    cursor.execute("ANALYZE broker_message")
    cursor.execute("ANALYZE broker_delivery")
Message.objects.update(state="pending", expires=None)


def scans(node, found):
    table = node.get("Relation Name")
    if table in ("broker_message", "broker_delivery") and node["Node Type"].endswith("Scan"):
        found.append((table, node["Node Type"], node.get("Index Name")))
    for child in node.get("Plans", ()):
        scans(child, found)
    return found


plans = []
with connection.cursor() as cursor:
    raw = cursor.cursor  # psycopg: server-side binding, each statement planned for its values
    for sql, params in _finish_statements(ids[-50:], now):
        raw.execute("EXPLAIN (FORMAT JSON) " + sql, params, prepare=False)
        plan = raw.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        plans.append(scans(plan[0]["Plan"], []))
print("RESULT " + json.dumps(plans))
"""


@pytest.fixture
def postgres_database(tmp_path):
    with fresh_database("postgres", tmp_path) as env:
        yield env


def test_an_ack_batch_finds_its_messages_by_primary_key_whatever_the_statistics(
        postgres_database):
    """The UPDATE that finishes an ACK batch (PostgreSQL) reads the batch's messages by
    their primary key, and their deliveries by their index, even when the statistics say no
    message waits and every message has an expiry: a plan made from such statistics read
    every waiting message through another index instead (5-9 ms an ACK batch in the latency
    benchmark, instead of about 0.3), and a join of the deliveries grouped afterwards read
    them all."""
    plans = shell_result(postgres_database, PLAN_SCRIPT)
    assert len(plans) == 1  # one UPDATE finishes the batch
    for found in plans:
        messages = [index for table, _, index in found if table == "broker_message"]
        deliveries = [kind for table, kind, _ in found if table == "broker_delivery"]
        assert messages, "the message table is not read at all?"
        assert all(index == "broker_message_pkey" for index in messages), found
        # The deliveries of the batch's messages only, by their index: never all of them.
        assert deliveries and "Seq Scan" not in deliveries, found


FINISH_SCRIPT = r"""
import json
from datetime import timedelta
from django.db import transaction
from django.utils import timezone
from accounts.models import Account
from broker.models import Delivery, Message
from broker.services.ack import finish_messages
from topics.models import Topic

bob = Account.objects.create(username="bob")
ann = Account.objects.create(username="ann")
topic = Topic.objects.create(path="/finish")
now = timezone.now()
earlier = now - timedelta(hours=1)
cases = {
    # name: (message fields, deliveries: bob's state, ann's state or None)
    "acked": ({}, "acked", "acked"),
    "open": ({}, "acked", "notified"),
    "dead": ({}, "acked", "dead"),
    "dead_and_open": ({}, "dead", "pending"),
    "no_deliveries": ({}, None, None),
    "state_message": ({"timeout": -1}, "acked", None),
    "no_timeout": ({"timeout": None}, "acked", None),
    "expiring": ({"expires": earlier}, "acked", None),
    "trashed_dead": ({"state": "trash", "trashed": earlier}, "dead", None),
}
ids = {}
for name, (fields, first, second) in cases.items():
    m = Message.objects.create(topic=topic, cmuid=name, created=now,
                               **{"timeout": 60, **fields})
    ids[name] = m.pk
    for account, state in ((bob, first), (ann, second)):
        if state:
            Delivery.objects.create(account=account, message=m, state=state)
with transaction.atomic():
    finish_messages(sorted(ids.values()), now)
out = {}
for name, pk in ids.items():
    m = Message.objects.get(pk=pk)
    out[name] = [m.state,
                 None if m.expires is None else round((m.expires - now).total_seconds()),
                 None if m.trashed is None else round((m.trashed - now).total_seconds())]
print("RESULT " + json.dumps(out))
"""


def test_an_ack_batch_finishes_each_message_by_the_same_rule_on_both_backends(database):
    """What :func:`finish_messages` does with each message of an ACK batch, the same on
    SQLite (the rule in Python) and PostgreSQL (one UPDATE): open for no one and dead for
    someone: to Trash (if still waiting); ACKed by everyone (or no delivery at all): the
    timeout starts, unless it has, or there is none (a state message, no timeout); open for
    someone: nothing yet."""
    out = shell_result(database, FINISH_SCRIPT)
    assert out == {
        "acked": ["pending", 60, None],
        "open": ["pending", None, None],
        "dead": ["trash", None, 0],
        "dead_and_open": ["pending", None, None],
        "no_deliveries": ["pending", 60, None],
        "state_message": ["pending", None, None],
        "no_timeout": ["pending", None, None],
        "expiring": ["pending", -3600, None],
        "trashed_dead": ["trash", None, -3600],
    }
