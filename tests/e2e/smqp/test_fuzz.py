"""A fuzz test over real sockets against a dedicated ``manage.py runsmqp`` (SQLite): thousands of
valid, mutated and random command lines, then random byte streams. Every line gets exactly one
well-formed reply with a profile code, never a traceback; the server never drops another session
and the stored data is unchanged.

The corpus is reproducible: it comes from ``random.Random(seed)`` (``SMQP_FUZZ_SEED`` overrides
the fixed default; the seed is printed). Lines the harness cannot frame are left out on purpose,
each for a stated reason (see ``framing_safe``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest

from tests.conftest import base_env, start_listener, stop_listener
from tests.support.smqp_client import RawClient
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("SMQP_FUZZ_SEED", "720721"))
FUZZ_LINES = 4000  # lines of logged-in fuzz, split over several connections
PRELOGIN_LINES = 400  # lines sent before any login, over two more connections
LINES_PER_CONNECTION = 500
MAX_LINE = 4096  # profile section 1

GREETING = re.compile(rb"^SMQP/1\.0 Ready\. .+\r\n$")
REPLY_LINE = re.compile(rb"^(\d{3})([ -])")
REPLY_END = re.compile(rb"^\d{3} ")
ALLOWED_CODES = {200, 310, 400, 401, 404, 405, 406, 408, 409, 414, 500, 501, 510}
LEAKS = (b"Traceback", b'File "', b"Error:", b"Exception")
CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


# --- stored-data digest -----------------------------------------------------------------------

# Everything the fuzzing sessions must not be able to change. The fuzz accounts may
# legitimately change their own subscriptions and their own profile fields (SET LOGIN NAME,
# EMAIL, ADDRESS, PHONE), so exactly those rows/fields are left out for them. Their password
# hash stays in: no corpus line holds their password, so SET LOGIN PASSWORD can never succeed.
DIGEST_SCRIPT = """
import json
from accounts.models import Account
from broker.models import Message, Subscription
from topics.models import QUEUE_PARAMETERS, Topic
from ual.models import UALEntry

own = set(json.loads({own!r}))
topics = [
    [t.path, t.key, t.parent.path if t.parent_id else None, t.link.path if t.link_id else None,
     t.account.username if t.account_id else None, t.state, t.delivery_mode,
     [getattr(t, p) for p in QUEUE_PARAMETERS], [k.keyword for k in t.keywords.all()]]
    for t in Topic.objects.select_related("parent", "link", "account")
    .prefetch_related("keywords")
]
accounts = []
for a in Account.objects.prefetch_related("groups"):
    row = [a.username, a.password, a.is_superuser, a.is_staff, a.is_active,
           a.is_remote_server, sorted(g.name for g in a.groups.all())]
    if a.username not in own:
        row += [a.proper_name, a.email, a.postal_address, a.phone, a.first_name, a.last_name]
    accounts.append(row)
subscriptions = [
    [s.account.username, s.resource, s.pattern, s.since.isoformat() if s.since else None]
    for s in Subscription.objects.select_related("account").exclude(account__username__in=own)
]
ual = [
    [e.topic.path, e.principal_kind, e.account.username if e.account_id else None,
     e.group.name if e.group_id else None, e.right, e.effect]
    for e in UALEntry.objects.select_related("topic", "account", "group")
]
messages = [
    [m.pk, m.topic_id, m.cmuid, m.name, m.size, m.sections.count()]
    for m in Message.objects.all()
]
digest = {{name: sorted(rows, key=json.dumps) for name, rows in [
    ("topics", topics), ("accounts", accounts), ("subscriptions", subscriptions),
    ("ual", ual), ("messages", messages)]}}
print(json.dumps(digest, sort_keys=True))
"""


def stored_digest(broker, own: list[str]) -> dict:
    script = DIGEST_SCRIPT.format(own=json.dumps(own))
    out = broker.manage("shell", "--no-imports", "-c", script).stdout
    return json.loads(out.strip().splitlines()[-1])


def assert_same_digest(before: dict, after: dict) -> None:
    for name in before:
        if before[name] != after[name]:
            gone = [r for r in before[name] if r not in after[name]]
            new = [r for r in after[name] if r not in before[name]]
            raise AssertionError(f"stored {name} changed: removed {gone!r}, added {new!r}")
    assert before == after


# --- fixtures ---------------------------------------------------------------------------------


@dataclass
class FuzzSetup:
    broker: object
    tag: str
    root: str  # the superuser's topic tree, unique to this run
    password: str  # of the fuzz accounts (never appears in the corpus)
    norights: str  # a plain account without any UAL entry
    reader: str  # a plain account with only "subscribe" on the tree (it may see, not change)
    own: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def fuzz(database_urls, tmp_path_factory):
    var = tmp_path_factory.mktemp("fuzz")
    env = base_env(var, database_urls["sqlite"])
    # The fuzz sends hundreds of wrong PASS lines from one address. The failure throttle
    # (tested in e2e/smqp/test_session) would otherwise slow the fuzz down and refuse its logins.
    env.update(SMQP_LOGIN_FAILURES_BEFORE_DELAY="1000000",
               SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT="1000000")
    broker = start_listener(env, var, name="fuzz")
    try:
        tag = uuid.uuid4().hex[:8]
        setup = FuzzSetup(broker, tag, f"/fz{tag}", uuid.uuid4().hex,
                          f"fuzz{tag}", f"fuzzr{tag}")
        setup.own = [setup.norights, setup.reader]
        root_account = f"fuzzroot{tag}"
        # The accounts in one process (a manage.py start costs ~2 s of CPU).
        broker.manage("shell", "--no-imports", "-c", (
            "from django.core.management import call_command\n"
            "from accounts.models import Account as A\n"
            f"if not A.objects.filter(username_key={root_account!r}).exists():\n"
            f"    call_command('createaccount', {root_account!r}, '--password', 'pw',"
            " '--superuser')\n"
            f"for name in {setup.own!r}:\n"
            f"    call_command('createaccount', name, '--password', {setup.password!r})\n"))
        r = setup.root
        with RawClient(broker.host, broker.port) as c:
            c.login(root_account, "pw")
            for line in [
                f"CREATE TOPIC {r} (FUZZ)",
                f"CREATE TOPIC {r}/stocks (STOCKS,TICKERS)",
                f"CREATE TOPIC {r}/stocks/quotes",
                f"CREATE TOPIC {r}/stocks/quotes/ibm (IBM,BIG BLUE,Ärger)",
                f"CREATE TOPIC {r}/stocks/quotes/msft",
                f"CREATE TOPIC {r}/info",
                f"CREATE TOPIC {r}/news > {r}/stocks/quotes",
            ]:
                assert c.command(line) == [b"200 OK\r\n"], line
        broker.manage("grant", setup.reader, r, "subscribe")
        yield setup
    finally:
        stop_listener(broker)


# --- the corpus -------------------------------------------------------------------------------

TOKENS = [
    "*", "/", "/*", "//", "/a//b", "/a/", ">", "> /", "(", ")", "()", "(,)", "((a))", "(a,b",
    ",", ",,,", "-", "-1", "0", "1", "1-", "-5", "5-1", "1,,2", "1809-1812,1845", "0-0",
    "99999999999999999999999", "9223372036854775807", "9223372036854775808", "1e9", "0x10",
    "NaN", "D08232001T14451246Z", "D99999999T999999Z", "D02302001T250000Z",
    "2001-08-23T14:45:12.46Z", "00:24:00:00", "-1", "YES", "NO", "CLEAR/1.0", "CLEAR",
    "KERBEROS/4.0", "/1.0", "%s%n%x", "{}", "'; DROP TABLE topics_topic; --", "\\", "..",
    "/..", "/Trash", "/trash/x", "/accounts/*", "/accounts", "TOPIC", "MESSAGE", "MESS", "SUB",
    "SUBSCRIBERS", "SERVER", "TIMEOUT", "KEYWORDS", "KEY", "NAME", "EMAIL", "PASSWORD", "REPLY",
    "TOPICS", "a@b", "@", "ÄRGER", "/日本/東京", "/ß", "/İstanbul", "/a_1/b_2", "/_x", "/1a",
    "/a-b", "\t", " ", "310", "ACK", "+", "=", "\"", "'",
]
LONG_TOKENS = [
    "x" * 5000, "/a" * 2500, "(" + ",".join(["k"] * 2400) + ")", "1-2," * 1250,
    "/" + "a" * 3900, "/a" * 1900, "(" + ",".join(["kw"] * 1300) + ")", "1-2," * 900 + "3",
    "日" * 1400,  # 4,200 bytes in UTF-8
]
CONTROLS = [b"\x00", b"\x01", b"\x07", b"\x08", b"\x0b", b"\x0c", b"\x1b", b"\x7f", b"\r",
            b"\t", b"\xff", b"\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]
UNICODE = ["é", "ß", "ı", "İ", "ſ", "Ⅻ", "日本", "\u200b", "\u202e", "\ufeff", "😀",  # noqa: RUF001 (confusable letters on purpose)
           "\U0010ffff", "\u0085", "\u2028", "\u00a0", "ﬃ", "\u0301", "Ω"]
KEYWORDS = ["IBM", "BIG BLUE", "stocks", "Ärger", "日本", "a b c", "blue", "x" * 150]


def valid_lines(rng: random.Random, root: str, me: str) -> list[str]:
    """One valid line of each kind the draft has, on existing and missing topics."""
    topics = [root, f"{root}/stocks", f"{root}/stocks/quotes", f"{root}/stocks/quotes/ibm",
              f"{root}/news", f"{root}/info", f"{root}/nothere", f"{root}/stocks/Trash",
              "/stocks", "/news", "/accounts", f"/accounts/{me}", "/accounts/bob"]
    t = rng.choice(topics)
    t2 = rng.choice(topics)
    pattern = rng.choice([*topics, f"{root}/*", f"{root}/stocks/*", "/*", "/accounts/*"])
    kws = "(" + ",".join(rng.sample(KEYWORDS, rng.randrange(1, 4))) + ")"
    resource = rng.choice(["MESSAGE", "MESS", "MESSAGES", "TOPIC", "TOPICS", "SUB",
                           "SUBSCRIBERS", "SUBSCRIBER"])
    return [
        f"COUNT {rng.choice(['TOPIC', 'MESSAGE', 'SUB', 'TOPICS', 'MESS'])} {pattern}",
        "COUNT TOPIC /",
        f"LIST TOPIC {rng.choice([*topics, '/'])}",
        f"LIST {rng.choice(['MESSAGE', 'MESSAGES', 'MESS'])} {t}",
        f"CREATE TOPIC {t}/fresh {kws} > {t2}",
        f"CREATE TOPIC {t}/fresh",
        f"CREATE TOPIC {t}",
        f"REMOVE TOPIC {t}",
        f"REM TOPIC {t}",
        f"SET TOPIC NAME {t} {t2}/moved",
        f"SET TOPIC {rng.choice(['KEYWORD', 'KEYWORDS', 'KEY'])} {t} {kws}",
        f"GET TOPIC {rng.choice(['KEYWORDS', 'KEY'])} {t}",
        f"FIND TOPIC {pattern}",
        f"FIND TOPICS {pattern} {kws}",
        f"SET LOGIN NAME {rng.choice(['Jayne Smith', 'Ärger Überall', 'x' * 300])}",
        f"SET LOGIN EMAIL {rng.choice(['fuzz@example.com', 'not-an-address'])}",
        "SET LOGIN ADDRESS 1 Main St, Springfield",
        "SET LOGIN PHONE +1 555 0100",
        "SET LOGIN PASSWORD CLEAR/1.0",
        "SET LOGIN PASS KERBEROS/4.0",
        f"SUB {resource} {pattern}",
        f"SUBSCRIBE MESSAGE {t} D08232001T14451246Z",
        "SUB SERVER TIMEOUT",
        f"UNSUB {resource} {pattern}",
        "UNSUB *",
        "UNSUBSCRIBE MESSAGE *",
        "UNSUB SERVER TIMEOUT",
        f"GET MESSAGE {t} {rng.choice(['1-5', '1809-1812,1845', '*', '1', '3-2'])}",
        f"REPUB MESS {t} 1",
        f"REPUBLISH MESSAGE {t} 99999999999999999999",
        f"SET NOTIFY {rng.choice(['SUSPEND', 'RESUME', 'SUS', 'RES'])}",
        "NOOP",
        f"LOGIN {me} CLEAR/1.0",
        f"LOGIN {rng.choice([me, 'bob'])} {rng.choice(['CLEAR', 'KERBEROS/4.0', 'CLEAR/2.0'])}",
        f"PASS {me} not-the-password",
        "PASS bob not-the-password",
        "PASSWORD bob",
        "310 ACK",
        rng.choice(["FROBNICATE", "HELO x", "GET", "SET", "LIST", "EHLO", "QUITX"]),
    ]


# SET NOTIFY PORT makes the server connect back to the client's address (profile section 8):
# only these invalid forms are sent, never a mutation of them (which could name a real port).
NOTIFY_PORT_LINES = [b"SET NOTIFY PORT 0", b"SET NOTIFY PORT 65536", b"SET NOTIFY PORT abc",
                     b"SET NOTIFY PORT -1", b"SET NOTIFY PORT 99999999999999999999999"]


def mutate(rng: random.Random, line: bytes) -> bytes:
    b = bytearray(line)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(12)
        pos = rng.randrange(len(b) + 1)
        if kind == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # control character, NUL, 0xFF, invalid UTF-8
            b[pos:pos] = rng.choice(CONTROLS)
        elif kind == 2:  # unicode
            b[pos:pos] = rng.choice(UNICODE).encode()
        elif kind == 3:  # truncation
            del b[pos:]
        elif kind == 4 and b:  # duplicate a slice
            i = rng.randrange(len(b))
            b[pos:pos] = b[min(i, pos):max(i, pos) + 1]
        elif kind == 5:  # the whole line twice
            b += rng.choice([b" ", b"", b"\t"]) + bytes(b)
        elif kind in (6, 7):  # replace, insert or delete a token
            words = bytes(b).split(b" ")
            i = rng.randrange(len(words))
            token = rng.choice(TOKENS).encode()
            if kind == 6:
                words[i] = token
            elif rng.random() < 0.5:
                words.insert(i, token)
            elif len(words) > 1:
                del words[i]
            b = bytearray(b" ".join(words))
        elif kind == 8:  # swap two tokens
            words = bytes(b).split(b" ")
            i, j = rng.randrange(len(words)), rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
            b = bytearray(b" ".join(words))
        elif kind == 9:  # very long token: over, at or just under the line limit
            token = rng.choice(LONG_TOKENS).encode()
            if rng.random() < 0.4:
                token = token[: max(1, MAX_LINE - len(b) - rng.choice([2, 1, 0]))]
            b[pos:pos] = b" " + token
        elif kind == 10:  # odd separators
            b = bytearray(bytes(b).replace(b" ", rng.choice([b"  ", b"\t", b" \t ", b"\x0b"])))
        else:  # case games
            b = bytearray(rng.choice([bytes(b).lower(), bytes(b).swapcase(), bytes(b).title()]))
    return bytes(b)


def framing_safe(line: bytes) -> bool:
    """Lines the harness can frame as "one line in, one reply out"."""
    if len(line) > 8192:
        line = line[:8192]
    if not line.strip():
        return False  # empty and blank lines get no reply (profile section 1)
    if line.lstrip().upper().startswith(b"PUB"):
        return False  # PUB/PUBLISH: a message frame follows the line (profile section 6)
    text = line.decode("utf-8", "replace").upper()
    if "SCRAM" in text:
        return False  # SCRAM-SHA-256 makes the next line a raw base64 step (profile section 5)
    return not ("NOTIFY" in text and "PORT" in text)  # see NOTIFY_PORT_LINES


def is_quit(line: bytes) -> bool:
    """Would the server read this line as QUIT (after which it closes)?"""
    if len(line) > MAX_LINE or CTL.search(line):
        return False
    try:
        text = line.decode()
    except UnicodeDecodeError:
        return False
    word, _, rest = text.lstrip(" ").partition(" ")
    return word.upper() == "QUIT" and not rest.strip(" ")


def make_corpus(rng: random.Random, n: int, root: str, me: str) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < n:
        roll = rng.random()
        if roll < 0.01:
            line = rng.choice([b"QUIT", b"quit", b" QUIT  "])
        elif roll < 0.02:
            line = rng.choice(NOTIFY_PORT_LINES)
            out.append(line)
            continue
        elif roll < 0.06:  # random binary
            line = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        elif roll < 0.08:  # a long line of one token, right around the limit
            size = rng.choice([MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 5000])
            line = (rng.choice(["NOOP ", "LIST TOPIC /", "SET LOGIN NAME ", ""]) +
                    "y" * 5000).encode()[:size]
        else:
            line = rng.choice(valid_lines(rng, root, me)).encode()
            if roll >= 0.3:
                line = mutate(rng, line)
        line = line.replace(b"\n", b"")
        if framing_safe(line):
            out.append(line)
    return out


# --- the client side --------------------------------------------------------------------------


def read_exact(c: RawClient, n: int) -> bytes:
    while len(c.buf) < n:
        chunk = c.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a NOTIFY MESSAGE")
        c.buf += chunk
    data, c.buf = c.buf[:n], c.buf[n:]
    return data


def skip_notification(c: RawClient, first: bytes) -> None:
    """Skip one NOTIFY block (a NOTIFY MESSAGE is framed like a message, profile section 6)."""
    if not first.upper().startswith(b"NOTIFY MESSAGE"):
        while c.read_line() not in (b"\r\n", b"\n", b""):
            pass
        return
    while c.read_line() not in (b"\r\n", b"\n", b""):
        pass
    while True:
        line = c.read_line()
        if line in (b".\r\n", b".\n", b""):
            return
        length = 0
        while line not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
            line = c.read_line()
        read_exact(c, length + 2)


def read_reply(c: RawClient, sent: bytes) -> list[bytes] | None:
    """One reply (NOTIFY blocks before it skipped); None if the server closed first."""
    lines: list[bytes] = []
    while True:
        try:
            line = c.read_line()
        except TimeoutError:
            raise AssertionError(f"no reply to {sent!r} (so far {lines!r})") from None
        if not line:
            assert not lines, f"closed in the middle of the reply to {sent!r}: {lines!r}"
            return None
        if not lines and line.startswith(b"NOTIFY "):
            skip_notification(c, line)
            continue
        lines.append(line)
        match = REPLY_LINE.match(line)
        assert match and line.endswith(b"\r\n"), (
            f"not a reply line {line!r} in the reply to {sent!r}: {lines!r}")
        assert line[:3] == lines[0][:3], f"mixed codes in the reply to {sent!r}: {lines!r}"
        if REPLY_END.match(line):
            return lines


@dataclass
class Findings:
    codes: Counter = field(default_factory=Counter)
    server_errors: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    lines: int = 0
    reconnects: int = 0

    def check(self, sent: bytes, reply: list[bytes]) -> None:
        self.lines += 1
        code = int(reply[0][:3])
        self.codes[code] += 1
        data = b"".join(reply)
        for leak in LEAKS:
            assert leak not in data, f"{leak!r} in the reply to {sent!r}: {reply!r}"
        assert code in ALLOWED_CODES, f"code {code} in the reply to {sent!r}: {reply!r}"
        if code == 500:
            self.server_errors.append((sent, reply))


def open_session(setup: FuzzSetup, user: str | None) -> RawClient:
    c = RawClient(setup.broker.host, setup.broker.port, timeout=30)
    if user is None:
        assert GREETING.match(c.read_line())
    else:
        c.login(user, setup.password)
    return c


def run_lines(setup: FuzzSetup, user: str | None, lines: list[bytes], rng: random.Random,
              findings: Findings) -> None:
    """Send ``lines`` pipelined in small batches (a QUIT always ends its batch), check every
    reply, and reconnect (logging in again) after each QUIT."""
    c = open_session(setup, user)
    try:
        i = 0
        while i < len(lines):
            batch: list[bytes] = []
            size = rng.randrange(1, 9)
            while i < len(lines) and len(batch) < size:
                batch.append(lines[i])
                i += 1
                if is_quit(batch[-1]):
                    break
            c.send(b"".join(line + b"\r\n" for line in batch))
            for n, sent in enumerate(batch):
                reply = read_reply(c, sent)
                assert reply is not None, (
                    f"server closed the session before answering {sent!r} "
                    f"(batch {batch[:n + 1]!r})")
                findings.check(sent, reply)
            if is_quit(batch[-1]):
                assert reply == [b"200 OK\r\n"], (batch[-1], reply)
                rest = c.read_until_closed()
                assert b"Traceback" not in rest
                c.close()
                findings.reconnects += 1
                c = open_session(setup, user)
    finally:
        c.close()


# --- the tests --------------------------------------------------------------------------------


def test_fuzzed_command_lines_get_clean_replies_and_change_nothing(fuzz):
    print(f"fuzz seed {SEED} (set SMQP_FUZZ_SEED to replay)")
    rng = random.Random(SEED)
    broker = fuzz.broker
    before = stored_digest(broker, fuzz.own)
    findings = Findings()
    started = time.monotonic()
    with RawClient(broker.host, broker.port) as watcher:
        watcher.login("bob", "pw")
        plan: list[tuple[str | None, int]] = []
        for k in range(FUZZ_LINES // LINES_PER_CONNECTION):
            plan.append(((fuzz.norights, fuzz.reader)[k % 2], LINES_PER_CONNECTION))
        plan.insert(2, (None, PRELOGIN_LINES // 2))
        plan.insert(6, (None, PRELOGIN_LINES // 2))
        for user, count in plan:
            me = user or rng.choice([fuzz.norights, "bob"])
            lines = make_corpus(rng, count, fuzz.root, me)
            run_lines(fuzz, user, lines, rng, findings)
            assert watcher.command("NOOP") == [b"200 OK\r\n"], "the watcher session was hurt"
        assert watcher.command("NOOP") == [b"200 OK\r\n"]
    elapsed = time.monotonic() - started
    print(f"{findings.lines} lines in {elapsed:.1f} s, {findings.reconnects} reconnects after "
          f"QUIT; reply codes {dict(sorted(findings.codes.items()))}")
    assert findings.lines >= FUZZ_LINES + PRELOGIN_LINES
    assert not findings.server_errors, "500 replies (server bugs) to these lines:\n" + "\n".join(
        f"{sent!r} -> {reply!r}" for sent, reply in findings.server_errors)
    # New logins still work, for the watcher's account and for a fuzz account.
    with RawClient(broker.host, broker.port) as c:
        c.login("bob", "pw")
        assert c.command("NOOP") == [b"200 OK\r\n"]
    with RawClient(broker.host, broker.port) as c:
        c.login(fuzz.norights, fuzz.password)
    assert broker.alive()
    log = broker.log()
    assert "Traceback" not in log, log[-5000:]
    assert_same_digest(before, stored_digest(broker, fuzz.own))


def _raw_stream(setup: FuzzSetup, seed: int) -> tuple[int, bytes]:
    """One connection that sends 1-20 KB of random bytes, then leaves in one of three ways.
    Returns (how it left, what the server sent)."""
    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(1024, 20 * 1024 + 1)))
    way = rng.randrange(3)
    if way == 1:
        data = data.replace(b"\n", b"")  # no line end at all
    s = socket.create_connection((setup.broker.host, setup.broker.port), timeout=scaled(30))
    try:
        if way == 2:  # abortive close (RST) right after sending
            s.sendall(data)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return way, b""
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        return way, received
    finally:
        s.close()


def test_random_byte_streams_do_not_hurt_other_sessions(fuzz):
    print(f"raw byte fuzz seed {SEED}")
    broker = fuzz.broker
    before = stored_digest(broker, fuzz.own)
    codes: Counter = Counter()
    with RawClient(broker.host, broker.port) as watcher:
        watcher.login("bob", "pw")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda k: _raw_stream(fuzz, SEED * 1000 + k), range(200)))
        for k, (_way, received) in enumerate(results):
            assert b"Traceback" not in received and b'File "' not in received, (k, received)
            lines = received.splitlines(keepends=True)
            if not lines:
                continue
            assert GREETING.match(lines[0]), (k, lines[0])
            for line in lines[1:]:
                match = REPLY_LINE.match(line)
                assert match and line.endswith(b"\r\n"), (k, line)
                codes[int(match[1])] += 1
        assert watcher.command("NOOP") == [b"200 OK\r\n"]
    print(f"reply codes to random bytes: {dict(sorted(codes.items()))}")
    assert set(codes) <= ALLOWED_CODES - {500}, codes
    with RawClient(broker.host, broker.port) as c:
        c.login("bob", "pw")
        assert c.command("NOOP") == [b"200 OK\r\n"]
    assert broker.alive()
    log = broker.log()
    assert "Traceback" not in log, log[-5000:]
    assert_same_digest(before, stored_digest(broker, fuzz.own))
