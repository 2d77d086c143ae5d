"""Issue 5's permission matrix, over real sockets against a real ``runsmqp``: every right x
principal kind (account, group, remote server, everyone) x inheritance depth (the entry at depth
1, 2 or 3 above or at a depth-3 topic) x allow/deny.

Each cell is a tree of its own, ``/mx_<right>_<kind>_<depth>_<effect>/l2/l3``, holding:

* the tested entry: ``effect`` of ``right`` to the kind's principal at ``depth``;
* a counter entry through another principal that also names the tester, which the tested entry
  must beat: for an allow below depth 1 a deny at depth 1 (the nearer level wins); for a deny an
  allow at depth 1 (nearer level, or at depth 1 the same level, where a deny beats an allow);
* an allow of another right at depth 1 for the tester, so the topic is visible to it and a
  refusal is 401 (a topic an account cannot see is 404, never revealing that it exists).

The tester must be allowed exactly where the tested entry allows. An outsider (no group, not a
server) is checked too: only ``everyone`` entries concern it.

Rights with an SMQP command are checked through it: subscribe (SUBSCRIBE MESSAGE), manage
(CREATE TOPIC, SET TOPIC NAME, REMOVE TOPIC), publish (PUBLISH MESSAGE) and reply (PUBLISH
REPLY). modify and remote have no SMQP command: they are checked with ``ual.check`` in a
separate ``manage.py shell`` process. Then a revoke is shown to take effect on the server within
a second, for new subscriptions and for an existing one.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import query_database
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

RIGHTS = ("publish", "subscribe", "manage", "modify", "reply", "remote")
WIRE_RIGHTS = ("subscribe", "manage", "publish", "reply")
KINDS = ("account", "group", "server", "everyone")
DEPTHS = (1, 2, 3)
EFFECTS = ("allow", "deny")
# The account tested for each principal kind, and the outsider.
TESTER = {"account": "m_acc", "group": "m_grp", "server": "m_srv", "everyone": "m_any"}
OUTSIDER = "m_out"
GROUP = "matrix_group"


@dataclass(frozen=True)
class Entry:
    depth: int
    kind: str  # account | group | server | everyone; account/group/server name the tester
    right: str
    effect: str


@dataclass(frozen=True)
class Cell:
    right: str
    kind: str
    depth: int
    effect: str
    prefix: str = "mx"

    @property
    def root(self) -> str:
        return f"/{self.prefix}_{self.right}_{self.kind}_{self.depth}_{self.effect}"

    @property
    def topic(self) -> str:
        return f"{self.root}/l2/l3"

    def level(self, depth: int) -> str:
        return "/".join(self.topic.split("/")[: depth + 1])

    @property
    def tester(self) -> str:
        return TESTER[self.kind]

    def entries(self) -> list[Entry]:
        counter_kind = "everyone" if self.kind == "account" else "account"
        found = [Entry(self.depth, self.kind, self.right, self.effect)]
        if self.effect == "deny":
            found.append(Entry(1, counter_kind, self.right, "allow"))
        elif self.depth > 1:
            found.append(Entry(1, counter_kind, self.right, "deny"))
        visible_by = "publish" if self.right == "subscribe" else "subscribe"
        found.append(Entry(1, "account", visible_by, "allow"))
        return found

    def expected(self, outsider: bool, right: str | None = None) -> bool:
        """The draft's rule, restated: the nearest level with an entry that concerns the
        account decides; there a deny beats an allow; no entry: deny."""
        right = right or self.right
        concerning = [e for e in self.entries()
                      if e.right == right and (not outsider or e.kind == "everyone")]
        for depth in (3, 2, 1):
            here = [e for e in concerning if e.depth == depth]
            if here:
                return all(e.effect == "allow" for e in here)
        return False

    def expected_on_the_wire(self, outsider: bool) -> bool:
        """Allowed, and the topic visible: a topic is visible with publish, subscribe or
        manage allowed on it (with reply alone, PUBLISH REPLY answers 404)."""
        visible = any(self.expected(outsider, r) for r in ("publish", "subscribe", "manage"))
        return visible and self.expected(outsider)


CELLS = [Cell(*combo) for combo in itertools.product(RIGHTS, KINDS, DEPTHS, EFFECTS)]


def setup_script(cells: list[Cell], accounts: bool = True) -> str:
    """One shell run that creates the accounts and the group (unless ``accounts`` is false:
    they exist), every tree and every entry."""
    spec = [
        {"topic": cell.topic, "tester": cell.tester,
         "entries": [{"level": cell.level(e.depth), "kind": e.kind, "right": e.right,
                      "effect": e.effect} for e in cell.entries()]}
        for cell in cells
    ]
    return f"""
import json
from django.contrib.auth.models import Group
from django.db import transaction
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry

spec = json.loads({json.dumps(json.dumps(spec))})
with transaction.atomic():
    if {accounts!r}:
        group = Group.objects.create(name={GROUP!r})
        for name in {sorted({*TESTER.values(), OUTSIDER})!r}:
            a = Account(username=name, is_remote_server=(name == {TESTER["server"]!r}))
            a.set_password("pw")
            a.save()
            if name == {TESTER["group"]!r}:
                a.groups.add(group)
    group = Group.objects.get(name={GROUP!r})
    accounts = {{a.username: a for a in Account.objects.all()}}
    topics = {{}}
    for cell in spec:
        parts = cell["topic"].split("/")[1:]
        parent = None
        for i in range(1, len(parts) + 1):
            path = "/" + "/".join(parts[:i])
            if path not in topics:
                topics[path] = Topic.objects.create(path=path, parent=parent)
            parent = topics[path]
        for e in cell["entries"]:
            kind = e["kind"]
            UALEntry.objects.create(
                topic=topics[e["level"]], principal_kind=kind, right=e["right"],
                effect=e["effect"],
                account=accounts[cell["tester"]] if kind in ("account", "server") else None,
                group=group if kind == "group" else None)
print("ready", len(topics), UALEntry.objects.count())
"""


def check_script(questions: list[tuple[str, str, str]]) -> str:
    """``ual.check`` for each (account, topic, right), printed as one JSON list."""
    return f"""
import json
from accounts.models import Account
from topics.models import Topic
from ual import check

questions = json.loads({json.dumps(json.dumps(questions))})
accounts = {{a.username: a for a in Account.objects.all()}}
topics = {{t.path: t for t in Topic.objects.all()}}
print("ANSWERS", json.dumps([check(accounts[a], topics[t], r) for a, t, r in questions]))
"""


def run_checks(broker, questions: list[tuple[str, str, str]]) -> list[bool]:
    out = broker.manage("shell", "--no-imports", "-c", check_script(questions)).stdout
    line = next(line for line in out.splitlines() if line.startswith("ANSWERS "))
    return json.loads(line.removeprefix("ANSWERS "))


# ----------------------------------------------------------------------------- SMQP helpers


def code(reply: list[bytes]) -> int:
    return int(reply[-1][:3])


def command(c: RawClient, line: str) -> int:
    """Send a command, skip notifications, return the reply code."""
    c.send_line(line)
    return code(read_reply(c))


def read_reply(c: RawClient) -> list[bytes]:
    while True:
        first = c.read_line()
        if first.startswith(b"NOTIFY "):
            skip_notification(c, first)
            continue
        if first[3:4] == b" ":
            return [first]
        return [first, *c.read_reply()]


def skip_notification(c: RawClient, first: bytes) -> None:
    """Read the rest of a NOTIFY block (a NOTIFY MESSAGE is ACKed)."""
    if first.startswith(b"NOTIFY MESSAGE "):
        while c.read_line() not in (b".\r\n", b""):
            pass
        c.send_line("310 ACK")
        return
    while c.read_line() not in (b"\r\n", b""):
        pass


def received_within(c: RawClient, seconds: float) -> bytes:
    """Everything ``c`` has buffered or receives within ``scaled(seconds)`` (a quiet window:
    read to its end, so a notice arriving first does not end it early)."""
    data, c.buf = c.buf, b""
    deadline = time.monotonic() + scaled(seconds)
    while (left := deadline - time.monotonic()) > 0:
        c.sock.settimeout(left)
        try:
            chunk = c.sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def publish(c: RawClient, kind: str, topic: str, cmuid: str, *headers: str) -> int:
    head = "".join(f"{h}\r\n" for h in headers)
    c.send(f"PUBLISH {kind} {topic} {cmuid}\r\n{head}\r\nContent-Type: text/plain\r\n"
           f"Content-Length: 2\r\n\r\nhi\r\n.\r\n".encode())
    return code(read_reply(c))


def publish_original(c: RawClient, topic: str, cmuid: str) -> int:
    """Publish a message to reply to (as a superuser); its smuid."""
    c.send(f"PUBLISH MESSAGE {topic} {cmuid}\r\n\r\nContent-Type: text/plain\r\n"
           f"Content-Length: 2\r\n\r\nhi\r\n.\r\n".encode())
    reply = read_reply(c)
    assert code(reply) == 200, reply
    return int(reply[-1].split()[-1])


def exercise(c: RawClient, me: str, right: str, topic: str, n: int,
             original: int | None = None) -> tuple[bool, list[int]]:
    """Try ``right`` on ``topic`` through the SMQP commands that need it (a reply answers
    the message ``original``). Returns whether it was allowed and the reply codes seen.
    Every command must agree."""
    if right == "subscribe":
        codes = [command(c, f"SUBSCRIBE MESSAGE {topic}")]
        if codes[0] == 200:
            assert command(c, f"UNSUBSCRIBE MESSAGE {topic}") == 200
    elif right == "manage":
        first = command(c, f"CREATE TOPIC {topic}/x_{me}")
        if first == 200:
            codes = [first, command(c, f"SET TOPIC NAME {topic}/x_{me} {topic}/y_{me}"),
                     command(c, f"REMOVE TOPIC {topic}/y_{me}")]
        else:
            codes = [first, command(c, f"SET TOPIC NAME {topic} {topic}_{me}"),
                     command(c, f"REMOVE TOPIC {topic}")]
    elif right == "publish":
        codes = [publish(c, "MESSAGE", topic, f"M{n}")]
    elif right == "reply":
        # Profile §9.1: a reply names its original by Smuid (and goes to its publisher).
        codes = [publish(c, "REPLY", topic, f"R{n}", f"Smuid: test.example.net/{original}")]
    else:
        raise AssertionError(right)
    allowed = all(x == 200 for x in codes)
    assert allowed or 200 not in codes, f"{me} {right} {topic}: mixed replies {codes}"
    return allowed, codes


def login(broker, name: str) -> RawClient:
    c = RawClient(broker.host, broker.port)
    c.login(name, "pw")
    return c


@pytest.fixture(scope="module")
def matrix(fresh_broker) -> Iterator:
    for cell in CELLS:  # the test's own design: the tester is decided by the tested entry
        assert cell.expected(outsider=False) == (cell.effect == "allow"), cell
        assert cell.expected_on_the_wire(outsider=False) == (cell.effect == "allow"), cell
    out = fresh_broker.manage("shell", "--no-imports", "-c", setup_script(CELLS)).stdout
    assert "ready" in out, out
    # No wait for the listener's caches: every test logs in after this, and a login reads the
    # shared topic and UAL generations now (SMQP _begin_session).
    yield fresh_broker


# ------------------------------------------------------------------------------------ tests


def test_permission_matrix_over_smqp(matrix):
    """96 cells (4 rights with a command x 4 principal kinds x 3 depths x allow/deny), each
    for its tester (401 when refused: the topic is visible to it) and for the outsider."""
    clients = {name: login(matrix, name) for name in {*TESTER.values(), OUTSIDER, "root"}}
    wrong = []
    try:
        for n, cell in enumerate(c for c in CELLS if c.right in WIRE_RIGHTS):
            original = None
            if cell.right == "reply":
                original = publish_original(clients["root"], cell.topic, f"O{n}")
            for who, outsider in ((cell.tester, False), (OUTSIDER, True)):
                allowed, codes = exercise(clients[who], who, cell.right, cell.topic, n,
                                          original)
                want = cell.expected_on_the_wire(outsider)
                refused_ok = all(x in (401, 404) for x in codes) if outsider else \
                    all(x == 401 for x in codes)
                if allowed != want or (not allowed and not refused_ok):
                    wrong.append(f"{cell} as {who}: replies {codes}, wanted "
                                 f"{'200' if want else '401' if not outsider else '401/404'}")
    finally:
        for c in clients.values():
            c.close()
    assert not wrong, "\n".join(wrong)
    assert "Traceback" not in matrix.log()


def test_permission_matrix_by_ual_check(matrix):
    """All 144 cells, every right (modify and remote have no SMQP command), asked through
    ``ual.check`` in another process."""
    questions, wanted = [], []
    for cell in CELLS:
        for who, outsider in ((cell.tester, False), (OUTSIDER, True)):
            questions.append((who, cell.topic, cell.right))
            wanted.append(cell.expected(outsider))
    answers = run_checks(matrix, questions)
    wrong = [f"{q}: got {a}, wanted {w}" for q, a, w in zip(questions, answers, wanted,
                                                             strict=True) if a != w]
    assert not wrong, "\n".join(wrong)
    assert sum(wanted) and not all(wanted)


def test_a_revoke_reaches_the_server_within_a_second(matrix):
    """Allowed subscribe entries removed by ``manage.py grant --revoke`` (another process):
    the running server refuses a new SUBSCRIBE within a second."""
    cell = Cell("subscribe", "account", 2, "allow", prefix="rv")
    out = matrix.manage("shell", "--no-imports", "-c", setup_script([cell], accounts=False))
    assert "ready" in out.stdout, out
    with login(matrix, cell.tester) as c:
        assert command(c, f"SUBSCRIBE MESSAGE {cell.topic}") == 200
        assert command(c, f"UNSUBSCRIBE MESSAGE {cell.topic}") == 200
        matrix.manage("grant", cell.tester, cell.level(2), "subscribe", "--revoke")
        revoked = time.monotonic()
        while (reply := command(c, f"SUBSCRIBE MESSAGE {cell.topic}")) == 200:
            command(c, f"UNSUBSCRIBE MESSAGE {cell.topic}")
            assert time.monotonic() - revoked < scaled(1.0), \
                "still allowed a second after the revoke"
            time.sleep(0.02)
        # The counter entry (deny to everyone at depth 1) decides now.
        assert reply == 401


def test_an_existing_subscription_stops_receiving_after_a_revoke(matrix):
    """A subscriber whose subscribe right is revoked gets no message published afterwards."""
    topic = "/mx_revoke/l2/l3"
    matrix.manage("shell", "--no-imports", "-c", f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
parent = None
for path in ("/mx_revoke", "/mx_revoke/l2", {topic!r}):
    parent = Topic.objects.create(path=path, parent=parent)
UALEntry.objects.create(topic=Topic.objects.get(path="/mx_revoke"), principal_kind="account",
                        account=Account.objects.get(username="m_acc"), right="subscribe")
""")
    with login(matrix, "m_acc") as sub:
        with login(matrix, "root") as pub:
            assert command(sub, f"SUBSCRIBE MESSAGE {topic}") == 200
            assert publish(pub, "MESSAGE", topic, "BEFORE") == 200
            sub.sock.settimeout(scaled(10))
            first = sub.read_line()
            assert first == f"NOTIFY MESSAGE {topic}\r\n".encode(), first
            skip_notification(sub, first)
            assert sub.read_reply() == [b"310 ACK\r\n"]
        matrix.manage("grant", "m_acc", "/mx_revoke", "subscribe", "--revoke")
        # No wait for the listener to hear of the revoke: a publisher that logs in now makes
        # its listener read the UAL generation the revoke bumped, so this publish already
        # decides from the revoked rights (and the subscriber's sweep has not had to run).
        with login(matrix, "root") as pub:
            assert publish(pub, "MESSAGE", topic, "AFTER") == 200
        data = received_within(sub, 1.5)
        assert b"NOTIFY MESSAGE" not in data, data


def test_a_backlog_is_not_delivered_after_a_revoke(matrix):
    """Messages published while the subscriber was away are not delivered at its next login
    once its subscribe right is gone; each is dead for that account (recorded, so the
    message's own timeout is not held up), and a granted right delivers again."""
    topic = "/mx_backlog/l2"
    matrix.manage("shell", "--no-imports", "-c", f"""
from accounts.models import Account
from topics.models import Topic
from ual.models import UALEntry
top = Topic.objects.create(path="/mx_backlog")
Topic.objects.create(path={topic!r}, parent=top)
UALEntry.objects.create(topic=top, principal_kind="account",
                        account=Account.objects.get(username="m_grp"), right="subscribe")
""")
    with login(matrix, "m_grp") as sub:
        assert command(sub, f"SUBSCRIBE MESSAGE {topic}") == 200
        sub.send_line("QUIT")
    with login(matrix, "root") as pub:
        assert publish(pub, "MESSAGE", topic, "AWAY1") == 200
        assert publish(pub, "MESSAGE", topic, "AWAY2") == 200
    matrix.manage("grant", "m_grp", "/mx_backlog", "subscribe", "--revoke")
    # No wait: the login reads the UAL generation the revoke bumped.
    with login(matrix, "m_grp") as sub:
        assert command(sub, "NOOP") == 200
        data = received_within(sub, 1.5)
        assert b"NOTIFY MESSAGE" not in data, data
    # Read from the database itself (no ``manage.py shell`` start).
    states = sorted(state for (state,) in query_database(
        matrix.env, "SELECT d.state FROM broker_delivery d"
                    " JOIN accounts_account a ON a.id = d.account_id"
                    " JOIN broker_message m ON m.id = d.message_id"
                    " JOIN topics_topic t ON t.id = m.topic_id"
                    " WHERE a.username = %s AND t.path = %s", ("m_grp", topic)))
    assert states == ["dead", "dead"], states
    # Granted again: new messages flow again once the account subscribes again (the revoke
    # ended its subscription, profile §9.3, issue 26).
    matrix.manage("grant", "m_grp", "/mx_backlog", "subscribe")
    with login(matrix, "m_grp") as sub, login(matrix, "root") as pub:
        assert command(sub, f"SUBSCRIBE MESSAGE {topic}") == 200
        assert publish(pub, "MESSAGE", topic, "BACK") == 200
        sub.sock.settimeout(scaled(10))
        first = sub.read_line()
        assert first == f"NOTIFY MESSAGE {topic}\r\n".encode(), first
