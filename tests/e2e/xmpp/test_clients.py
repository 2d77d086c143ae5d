"""Issue 23, real clients: the XMPP door driven by two independent npm libraries,
``@xmpp/client`` (raw IQs, PLAIN over loopback) and ``stanza`` (its pubsub API,
SCRAM-SHA-256), run by Node from ``tests/xmpp_clients`` (``make test`` installs them with
``npm ci``), beside SMQP sessions on a real ``runsmqp`` and Daphne on one database.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ROOT, BrokerProcess, fresh_listener
from tests.e2e.xmpp.test_xmpp import SETUP, create, ok, publish, session, subscribe
from tests.support.queue_clients import ack_answer, store_rows
from tests.support.smqp_session import Session as SmqpSession
from tests.support.smqp_session import header
from tests.support.timing import scaled
from tests.support.xmpp_session import PUBSUB, XmppSession, daphne

pytestmark = pytest.mark.e2e

CLIENTS = ROOT / "tests" / "xmpp_clients"
NODE = shutil.which("node")
if NODE is None or not (CLIENTS / "node_modules" / "@xmpp" / "client").is_dir() \
        or not (CLIENTS / "node_modules" / "stanza").is_dir():
    pytest.skip("node and the npm clients (make test runs npm ci in tests/xmpp_clients)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def xmpp(tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    base = tmp_path_factory.mktemp("xmpp-clients")
    extra = {"SMQP_XMPP_PLAIN": "loopback", "SMQP_PBKDF2_ITERATIONS": "4096",
             "SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "1000"}
    with fresh_listener("postgres", base, extra, setup=SETUP) as broker, \
            daphne(broker.env, base) as url:
        yield broker, url


class NodeClient:
    """One ``client.mjs`` process; its JSON lines collected by a thread."""

    def __init__(self, **cfg) -> None:
        self.cfg = cfg
        self.proc = subprocess.Popen(
            [NODE, "--experimental-websocket", "--no-warnings", str(CLIENTS / "client.mjs"),
             json.dumps(cfg)],
            cwd=CLIENTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"event": "junk", "line": line})

    def drain(self) -> list[dict]:
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return self.seen

    def wait_for(self, match: Callable[[dict], bool], timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + scaled(timeout)
        checked = 0
        while True:
            self.drain()
            for line in self.seen[checked:]:
                if line.get("event") == "error":
                    raise AssertionError(f"{self.cfg['lib']} client error: {line}")
                if match(line):
                    return line
            checked = len(self.seen)
            if self.proc.poll() is not None and self.lines.empty():
                raise AssertionError(f"{self.cfg['lib']} client ended: {self.seen[-5:]}\n"
                                     f"{self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.cfg['lib']} client: nothing matched; "
                                     f"last lines {self.seen[-5:]}")
            time.sleep(0.05)

    def events(self, kind: str) -> list[dict]:
        return [line for line in self.drain() if line.get("event") == kind]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(scaled(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()


def node_path() -> str:
    return f"/x/c{uuid.uuid4().hex[:8]}"


def test_three_workers_at_two_doors_share_300_items_each_consumed_once(xmpp):
    """@xmpp/client (bob) and stanza (jtegen) XMPP workers and an SMQP queue subscriber
    (alice) on one queue node; 150 items published over XMPP and 150 over SMQP. The XMPP
    workers unlock some items and leave others to their lock timeout: those go on to the
    next subscriber. Every item is consumed exactly once, by the workers' own account and
    by the store."""
    broker, url = xmpp
    path = node_path()
    root = session(url, "root")
    create(root, path, queue=True, retry=3)
    base = {"url": url, "node": path, "password": "pw", "mode": "worker"}
    w_xmpp = NodeClient(lib="xmpp", user="bob", resource="xw", queueRequests=4,
                        unlockEvery=15, ignoreEvery=40, **base)
    w_stanza = NodeClient(lib="stanza", user="jtegen", resource="sw", queueRequests=4,
                          unlockEvery=20, ignoreEvery=35, **base)
    smqp_consumed: list[str] = []
    stop = threading.Event()
    try:
        for w in (w_xmpp, w_stanza):
            w.wait_for(lambda e: e["event"] == "subscribed")
        smqp = SmqpSession(broker.host, broker.port, "alice")
        assert smqp.command(f"SUB MESSAGE {path}").code == 200

        def smqp_worker() -> None:
            while not stop.is_set():
                try:
                    note = smqp.message(timeout=1.0)
                except TimeoutError:
                    continue
                except OSError:
                    return
                cmuid = header(note, "Cmuid") or ""
                smuid = header(note, "Smuid").rsplit("/", 1)[1]
                item = cmuid.split("xmpp-item:", 1)[1] if "xmpp-item:" in cmuid else smuid
                if ack_answer(smqp) == 310:
                    smqp_consumed.append(item)

        worker = threading.Thread(target=smqp_worker, daemon=True)
        worker.start()
        # 150 over XMPP (pipelined IQs), 150 over SMQP (pipelined PUBs)
        ids = []
        sent = [root.send_iq("set", f"<pubsub xmlns='{PUBSUB}'><publish node='{path}'>"
                                    f"<item id='p{i}'><job xmlns='urn:w'>{i}</job></item>"
                                    "</publish></pubsub>") for i in range(150)]
        for iq_id in sent:
            ok(root.reply(iq_id))
        ids += [f"p{i}" for i in range(150)]
        with SmqpSession(broker.host, broker.port, "root") as pub:
            for i in range(150):
                pub.send_publish(path, f"s{i}")
            for _ in range(150):
                reply = pub.reply()
                assert reply.code == 200, reply
                ids.append(reply.lines[-1].split()[-1])
        assert len(set(ids)) == 300

        def consumed() -> list[str]:
            return ([e["id"] for e in w_xmpp.events("consumed")]
                    + [e["id"] for e in w_stanza.events("consumed")] + smqp_consumed)

        deadline = time.monotonic() + scaled(240)
        while len(set(consumed())) < 300 and time.monotonic() < deadline:
            for w in (w_xmpp, w_stanza):
                assert not w.events("error"), w.events("error")
            time.sleep(scaled(0.5))
        done = consumed()
        counts = Counter(done)
        assert sorted(counts) == sorted(ids), f"{300 - len(counts)} items never consumed"
        assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]
        by_worker = {"@xmpp/client": len(w_xmpp.events("consumed")),
                     "stanza": len(w_stanza.events("consumed")), "smqp": len(smqp_consumed)}
        print("consumed by", by_worker)
        assert all(by_worker.values()), by_worker
        # unlocks (the workers' own) and lock timeouts (told with an unlock notification)
        unlocked = w_xmpp.events("unlocked") + w_stanza.events("unlocked")
        let_go = [e for w in (w_xmpp, w_stanza) for e in w.events("item")
                  if e["what"] in ("unlock", "ignore")]
        print("let go", len(let_go), "unlock notifications", len(unlocked))
        assert let_go and len(unlocked) >= len(let_go)
        # A consume refused is one whose lock ran out first (its 3 s went by under load
        # before the retract was handled): the broker must have told that worker so with an
        # unlock notification, and the item went to another (counted once above).
        for w in (w_xmpp, w_stanza):
            told = {e["id"] for e in w.events("unlocked")}
            unexplained = [e for e in w.events("refused")
                           if e["what"] != "consume" or e["id"] not in told
                           or e["condition"] not in ("item-not-found", "unexpected-request")]
            assert not unexplained, (w.cfg["lib"], unexplained, sorted(told))
        rows = store_rows(broker.env, (
            "SELECT m.id, count(d.id) FILTER (WHERE d.state = 'acked') FROM broker_message m "
            "JOIN topics_topic t ON t.id = m.topic_id LEFT JOIN broker_delivery d "
            f"ON d.message_id = m.id WHERE t.path = '{path}' GROUP BY m.id"))
        assert len(rows) == 300 and all(n == 1 for _, n in rows), rows
    finally:
        stop.set()
        w_xmpp.stop()
        w_stanza.stop()
        root.close()


def test_fanout_backlog_on_bind_and_both_directions_with_real_clients(xmpp):
    """stanza subscribes, goes offline, @xmpp/client publishes: stanza gets the backlog
    when it binds again. An SMQP publish reaches @xmpp/client with the
    urn:smqp:message:0 payload; an @xmpp/client publish reaches an SMQP subscriber."""
    broker, url = xmpp
    path = node_path()
    root = session(url, "root")
    create(root, path)
    base = {"url": url, "node": path, "password": "pw"}
    sub = NodeClient(lib="stanza", user="jtegen", resource="s1", mode="subscriber", **base)
    sub.wait_for(lambda e: e["event"] == "subscribed")
    sub.stop()
    pub = NodeClient(lib="xmpp", user="bob", resource="p1", mode="publisher", count=5,
                     ids=True, prefix="b", **base)
    pub.wait_for(lambda e: e["event"] == "published" and e["id"] == "b4")
    back = NodeClient(lib="stanza", user="jtegen", resource="s2", mode="listen", **base)
    try:
        for i in range(5):
            back.wait_for(lambda e, i=i: e["event"] == "item" and e["id"] == f"b{i}")
        # SMQP → @xmpp/client
        listener = NodeClient(lib="xmpp", user="alice", resource="l1", mode="subscriber",
                              **base)
        listener.wait_for(lambda e: e["event"] == "subscribed")
        with SmqpSession(broker.host, broker.port, "root") as smqp:
            assert smqp.command(f"SUB MESSAGE {path}").code == 200
            smqp.publish(path, "from-smqp", [("Name", "greeting")],
                         [("text/plain", b"hello xmpp")])
            got = listener.wait_for(lambda e: e["event"] == "item" and
                                    "urn:smqp:message:0" in e.get("payload", ""))
            assert "greeting" in got["payload"]
            # @xmpp/client → SMQP
            one = NodeClient(lib="xmpp", user="bob", resource="p2", mode="publisher", count=1,
                             ids=True, prefix="to-smqp", **base)
            one.wait_for(lambda e: e["event"] == "published")
            seen = []
            deadline = time.monotonic() + scaled(60)
            while time.monotonic() < deadline:
                note = smqp.message(timeout=30)
                smqp.ack()
                seen.append(header(note, "Cmuid") or "")
                if any("to-smqp0" in c for c in seen):
                    break
            assert any(c.endswith("xmpp-item:to-smqp0") for c in seen), seen
        listener.stop()
    finally:
        back.stop()
        root.close()


def test_python_client_and_publish_ids_of_real_clients_agree(xmpp):
    """What the real publisher's items look like to a plain RFC 7395 reader (the items
    request): ids as given, payload element as published."""
    _, url = xmpp
    path = node_path()
    root = session(url, "root")
    create(root, path)
    pub = NodeClient(lib="xmpp", user="bob", resource="p3", mode="publisher", count=2,
                     ids=True, prefix="e", url=url, node=path, password="pw")
    pub.wait_for(lambda e: e["event"] == "published" and e["id"] == "e1")
    reader = XmppSession(url)
    reader.login("alice")
    items = ok(reader.pubsub("get", f"<items node='{path}'/>")).findall(
        f".//{{{PUBSUB}}}item")
    assert [i.get("id") for i in items] == ["e0", "e1"]
    assert [next(iter(i)).tag for i in items] == ["{urn:test:entry}entry"] * 2
    ok(subscribe(reader, path))
    publish(root, path, "<z xmlns='urn:z'/>")
    reader.close()
    root.close()
