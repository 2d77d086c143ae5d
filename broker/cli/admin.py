"""``smqp admin``: the operators' commands over the broker's REST API, as ``rabbitmqadmin``
works over RabbitMQ's management API: sessions (list, close), a topic's consumers, purge,
peek, definitions export / import, accounts, grants (UAL entries), the overview.

It speaks HTTP with the standard library's ``urllib`` (one request at a time, JSON both
ways: nothing a third-party client would add here). Credentials: a bearer token
(``--token`` / ``SMQP_API_TOKEN``), or the account and password (``SMQP_ACCOUNT`` /
``SMQP_PASSWORD``), with which a token valid for a day is made and revoked again at the
end. Output is a table, or JSON with ``--json``. Exit statuses as ``smqp``'s: 1 refused,
2 wrong usage, 3 no connection, 4 not authenticated.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator

from .connection import CLIError

REFUSED, USAGE, CONNECTION, LOGIN = 1, 2, 3, 4
DEFAULT_URL = "http://127.0.0.1:8000"


def add_parser(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser(
        "admin", help="operators' commands over the REST API (like rabbitmqadmin)",
        description="Operators' commands over the broker's REST API (staff accounts). "
                    "Credentials: --token / SMQP_API_TOKEN, or SMQP_ACCOUNT and "
                    "SMQP_PASSWORD. Exit status: 1 refused, 2 usage, 3 no connection, "
                    "4 not authenticated.")
    a.add_argument("--url", default=os.environ.get("SMQP_API_URL", DEFAULT_URL),
                   help=f"the broker's HTTP address (SMQP_API_URL; default {DEFAULT_URL})")
    a.add_argument("--token", default=os.environ.get("SMQP_API_TOKEN"),
                   help="an API token (SMQP_API_TOKEN)")
    a.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="JSON instead of a table")
    verbs = a.add_subparsers(dest="admin_verb", metavar="WHAT", required=True)
    # --json after the command's words too (smqp admin sessions list --json).
    leaf = argparse.ArgumentParser(add_help=False)
    leaf.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="JSON instead of a table")

    verbs.add_parser("overview", help="rates, depths, sessions per door", parents=[leaf])

    s = verbs.add_parser("sessions", help="live sessions: list, close GUID")
    ss = s.add_subparsers(dest="action", required=True)
    ls = ss.add_parser("list", help="live sessions with their counters", parents=[leaf])
    ls.add_argument("--account", help="only this account's")
    ls.add_argument("--door", help="only this door's (smqp, xmpp, qqp)")
    close = ss.add_parser("close", help="close a session (NOTIFY SERVER BYE)",
                          parents=[leaf])
    close.add_argument("guid")

    c = verbs.add_parser("consumers", help="a topic's consumers with backlog and lag",
                         parents=[leaf])
    c.add_argument("topic")

    p = verbs.add_parser("purge", help="move a topic's pending messages to its Trash",
                         parents=[leaf])
    p.add_argument("topic")
    p.add_argument("--yes", action="store_true", help="do not ask")

    pk = verbs.add_parser("peek", help="messages waiting on a topic, not consumed",
                          parents=[leaf])
    pk.add_argument("topic")
    pk.add_argument("--count", "-n", type=int, default=10, help="at most (1-100)")
    pk.add_argument("--after", type=int, default=0, help="only after this smuid")
    pk.add_argument("--trash", action="store_true", help="its Trash instead")

    e = verbs.add_parser("export", help="definitions as one JSON document", parents=[leaf])
    e.add_argument("file", nargs="?", default="-", help="where (default stdout)")
    i = verbs.add_parser("import", help="apply a definitions document (idempotent)",
                         parents=[leaf])
    i.add_argument("file", help="the document (- for stdin)")

    ac = verbs.add_parser("accounts", help="accounts: list, show, add, set, passwd, delete")
    acs = ac.add_subparsers(dest="action", required=True)
    acs.add_parser("list", parents=[leaf])
    show = acs.add_parser("show", parents=[leaf])
    show.add_argument("name")
    add = acs.add_parser("add", help="new account; password from SMQP_NEW_PASSWORD or a "
                                     "prompt", parents=[leaf])
    add.add_argument("name")
    add.add_argument("--email", default="")
    add.add_argument("--proper-name", default="")
    add.add_argument("--superuser", action="store_true")
    st = acs.add_parser("set", help="change details and flags", parents=[leaf])
    st.add_argument("name")
    st.add_argument("--email")
    st.add_argument("--proper-name")
    st.add_argument("--phone")
    for flag in ("active", "staff", "superuser"):
        st.add_argument(f"--{flag}", choices=["yes", "no"])
    pw = acs.add_parser("passwd", help="reset the password (SMQP_NEW_PASSWORD or a prompt)",
                        parents=[leaf])
    pw.add_argument("name")
    dl = acs.add_parser("delete", parents=[leaf])
    dl.add_argument("name")

    g = verbs.add_parser("grants", help="UAL entries: list, add, delete")
    gs = g.add_subparsers(dest="action", required=True)
    gl = gs.add_parser("list", parents=[leaf])
    gl.add_argument("--topic")
    gl.add_argument("--account")
    ga = gs.add_parser("add", help="allow (or --deny) a right on a topic", parents=[leaf])
    ga.add_argument("topic")
    ga.add_argument("right", help="publish, subscribe, manage, modify, reply, remote")
    who = ga.add_mutually_exclusive_group(required=True)
    who.add_argument("--account")
    who.add_argument("--group")
    who.add_argument("--everyone", action="store_true")
    ga.add_argument("--deny", action="store_true")
    gd = gs.add_parser("delete", parents=[leaf])
    gd.add_argument("id", type=int)


class Api:
    """The REST API with one token; ``call`` returns the decoded JSON (None for 204)."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.base = url.rstrip("/") + "/api/v1/"
        self.token = token
        self.timeout = timeout
        self._made: int | None = None

    def login(self) -> None:
        if self.token:
            return
        account = os.environ.get("SMQP_ACCOUNT") or getpass.getuser()
        password = os.environ.get("SMQP_PASSWORD")
        if password is None:
            if not sys.stdin.isatty():
                raise CLIError("no credentials: set SMQP_API_TOKEN, or SMQP_PASSWORD", USAGE)
            password = getpass.getpass(f"Password for {account}: ")
        made = self.call("POST", "auth/tokens", {"username": account, "password": password,
                                                 "name": "smqp admin", "days": 1},
                         auth=False)
        self.token, self._made = made["token"], made["id"]

    def logout(self) -> None:
        if self._made is not None:
            with contextlib.suppress(CLIError):  # else it expires within a day
                self.call("DELETE", f"auth/tokens/{self._made}")

    def call(self, method: str, path: str, body: object = None,
             params: dict | None = None, auth: bool = True):
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items()
                                                 if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth and self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CLIError(f"cannot reach {self.base}: {reason}", CONNECTION) from None
        return json.loads(raw) if raw else None

    def pages(self, path: str, params: dict | None = None) -> Iterator[dict]:
        """Every item of a cursor-paged list."""
        page = self.call("GET", path, params=params)
        while True:
            yield from page["results"]
            if not page.get("next"):
                return
            nxt = urllib.parse.urlparse(page["next"])
            query = dict(urllib.parse.parse_qsl(nxt.query))
            page = self.call("GET", path, params=query)


def _refusal(exc: urllib.error.HTTPError) -> CLIError:
    try:
        problem = json.loads(exc.read() or b"{}")
    except ValueError:
        problem = {}
    text = problem.get("detail") or exc.reason
    errors = problem.get("errors")
    if errors:
        text += " " + json.dumps(errors)
    status = LOGIN if exc.code == 401 else REFUSED
    return CLIError(f"{exc.code} {text}", status)


def _topic(path: str) -> str:
    return urllib.parse.quote(path.strip("/"), safe="/")


def _new_password(name: str) -> str:
    password = os.environ.get("SMQP_NEW_PASSWORD")
    if password is None:
        if not sys.stdin.isatty():
            raise CLIError("no password: set SMQP_NEW_PASSWORD or run in a terminal", USAGE)
        password = getpass.getpass(f"New password for {name}: ")
        if getpass.getpass("Again: ") != password:
            raise CLIError("the passwords differ", USAGE)
    return password


# --------------------------------------------------------------------------------- output


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Rows as an aligned text table (header, then one line each)."""
    cells = [[title for _, title in columns]]
    for row in rows:
        cells.append(["" if row.get(key) is None else _cell(row.get(key))
                      for key, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    # One line: a value never runs into the next row.
    return str(value).replace("\n", "\\n").replace("\r", "\\r")


def emit(args: argparse.Namespace, data: object, text: Callable[[], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=None if isinstance(data, list) else 2), flush=True)
    else:
        out = text()
        if out:
            print(out, flush=True)


# ---------------------------------------------------------------------------------- verbs

SESSION_COLUMNS = [("guid", "guid"), ("door", "door"), ("account", "account"),
                   ("peer", "client"), ("started", "login"), ("messages_in", "in"),
                   ("messages_out", "out"), ("unacked", "unacked"), ("locked", "locked"),
                   ("rate_in", "in/s"), ("rate_out", "out/s")]


def run(args: argparse.Namespace) -> int:
    api = Api(args.url, args.token, args.timeout)
    api.login()
    try:
        return VERBS[args.admin_verb](args, api)
    finally:
        api.logout()


def cmd_overview(args, api: Api) -> int:
    stats = api.call("GET", "stats/")

    def text() -> str:
        rates = stats["rates"]["minutes"]
        doors = ", ".join(f"{d} {n}" for d, n in sorted(stats["sessions"]["by_door"].items()))
        lines = [f"sessions: {stats['sessions']['total']} ({doors or 'none'})",
                 "messages, last full minute: " + ", ".join(
                     f"{k} {rates[k][-2] if len(rates[k]) > 1 else 0}"
                     for k in ("publish", "deliver", "ack")),
                 "totals: " + ", ".join(f"{k} {v}" for k, v in stats["totals"].items()),
                 "", table(stats["topics"], [("path", "topic"), ("messages", "messages"),
                                             ("pending", "pending"), ("locked", "locked"),
                                             ("dead", "dead")])]
        if stats.get("counters_unavailable"):
            lines.insert(0, f"(counters unavailable: {stats['counters_unavailable']})")
        return "\n".join(lines)

    emit(args, stats, text)
    return 0


def cmd_sessions(args, api: Api) -> int:
    if args.action == "close":
        api.call("DELETE", f"sessions/{urllib.parse.quote(args.guid, safe='')}")
        emit(args, {"closed": args.guid}, lambda: f"session {args.guid} is being closed")
        return 0
    rows = list(api.pages("sessions/", {"account": args.account, "door": args.door,
                                        "limit": 500}))
    emit(args, rows, lambda: table(rows, SESSION_COLUMNS) if rows else "no live sessions")
    return 0


def cmd_consumers(args, api: Api) -> int:
    data = api.call("GET", f"queues/{_topic(args.topic)}/consumers")

    def text() -> str:
        head = (f"{data['topic']} ({data['delivery_mode']}): {data['messages']} pending, "
                f"oldest {data['oldest_seconds']:g} s")
        rows = [{**c, "patterns": [s["pattern"] for s in c["subscriptions"]]}
                for c in data["consumers"]]
        return head + "\n" + (table(rows, [
            ("account", "account"), ("patterns", "subscriptions"), ("sessions", "sessions"),
            ("backlog", "backlog"), ("locked", "locked"), ("dead", "dead"),
            ("lag_seconds", "lag s")]) if rows else "no consumers")

    emit(args, data, text)
    return 0


def cmd_purge(args, api: Api) -> int:
    if not args.yes and sys.stdin.isatty():
        answer = input(f"Move every pending message of {args.topic} to its Trash? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing purged", file=sys.stderr)
            return REFUSED
    data = api.call("POST", f"queues/{_topic(args.topic)}/purge")
    emit(args, data, lambda: f"purged {data['purged']} message(s) from {data['topic']}")
    return 0


def cmd_peek(args, api: Api) -> int:
    data = api.call("GET", f"queues/{_topic(args.topic)}/peek", params={
        "count": args.count, "after": args.after or None,
        "state": "trash" if args.trash else None})
    messages = data["messages"]

    def text() -> str:
        out = []
        for m in messages:
            states = ", ".join(f"{k} {v}" for k, v in sorted(m["deliveries"].items()))
            out.append(f"── {m['topic']}  smuid {m['smuid']}  cmuid {m['cmuid']}  "
                       f"{m['size']} bytes  received {m['received']}  "
                       f"deliveries: {states or 'none'}")
            out += [f"   {k}: {_cell(v)}" for k, v in m["headers"].items()]
            for section in m["sections"]:
                out.append(section["text"] if "text" in section else
                           f"[{section['size']} bytes of {section['content_type']}]")
        return "\n".join(out) if out else f"no messages waiting on {args.topic}"

    emit(args, messages, text)
    return 0


def cmd_export(args, api: Api) -> int:
    doc = api.call("GET", "definitions")
    text = json.dumps(doc, indent=2)
    if args.file == "-":
        print(text)
    else:
        with open(args.file, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"definitions written to {args.file}", file=sys.stderr)
    return 0


def cmd_import(args, api: Api) -> int:
    try:
        if args.file == "-":
            raw = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                raw = f.read()
        doc = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read {args.file}: {exc}", USAGE) from None
    counts = api.call("POST", "definitions", doc)
    emit(args, counts, lambda: table(
        [{"kind": k, **v} for k, v in counts.items()],
        [("kind", "what"), ("created", "created"), ("changed", "changed"),
         ("unchanged", "unchanged")]))
    return 0


ACCOUNT_COLUMNS = [("username", "account"), ("proper_name", "name"), ("email", "email"),
                   ("is_active", "active"), ("is_superuser", "superuser"),
                   ("is_remote_server", "server")]


def cmd_accounts(args, api: Api) -> int:
    name = urllib.parse.quote(getattr(args, "name", "") or "", safe="")
    if args.action == "list":
        rows = list(api.pages("accounts/", {"limit": 1000}))
        emit(args, rows, lambda: table(rows, ACCOUNT_COLUMNS))
    elif args.action == "show":
        row = api.call("GET", f"accounts/{name}")
        emit(args, row, lambda: table([row], ACCOUNT_COLUMNS))
    elif args.action == "add":
        row = api.call("POST", "accounts/", {
            "username": args.name, "password": _new_password(args.name),
            "email": args.email, "proper_name": args.proper_name,
            "superuser": args.superuser})
        emit(args, row, lambda: f"account {row['username']} created")
    elif args.action == "set":
        changes = {k: v for k, v in (("email", args.email), ("proper_name", args.proper_name),
                                     ("phone", args.phone)) if v is not None}
        for flag in ("active", "staff", "superuser"):
            if getattr(args, flag) is not None:
                changes[f"is_{flag}"] = getattr(args, flag) == "yes"
        if not changes:
            raise CLIError("nothing to change (--email, --proper-name, --phone, --active, "
                           "--staff, --superuser)", USAGE)
        row = api.call("PATCH", f"accounts/{name}", changes)
        emit(args, row, lambda: f"account {row['username']} changed")
    elif args.action == "passwd":
        api.call("POST", f"accounts/{name}/password", {"password": _new_password(args.name)})
        emit(args, {"account": args.name}, lambda: f"password of {args.name} reset")
    elif args.action == "delete":
        api.call("DELETE", f"accounts/{name}")
        emit(args, {"deleted": args.name}, lambda: f"account {args.name} deleted")
    return 0


ENTRY_COLUMNS = [("id", "id"), ("topic", "topic"), ("principal_kind", "who"),
                 ("account", "account"), ("group", "group"), ("right", "right"),
                 ("effect", "effect")]


def cmd_grants(args, api: Api) -> int:
    if args.action == "list":
        rows = list(api.pages("ual/entries/", {"topic": args.topic, "account": args.account,
                                               "limit": 1000}))
        emit(args, rows, lambda: table(rows, ENTRY_COLUMNS) if rows else "no entries")
    elif args.action == "add":
        kind = "everyone" if args.everyone else "account" if args.account else "group"
        body = {"topic": args.topic, "principal_kind": kind, "right": args.right,
                "effect": "deny" if args.deny else "allow"}
        if args.account:
            body["account"] = args.account
        if args.group:
            body["group"] = args.group
        row = api.call("POST", "ual/entries/", body)
        emit(args, row, lambda: f"entry {row['id']}: {row['effect']} {row['right']} on "
                                f"{row['topic']} to {row['account'] or row['group'] or kind}")
    elif args.action == "delete":
        api.call("DELETE", f"ual/entries/{args.id}")
        emit(args, {"deleted": args.id}, lambda: f"entry {args.id} deleted")
    return 0


VERBS: dict[str, Callable[[argparse.Namespace, Api], int]] = {
    "overview": cmd_overview, "sessions": cmd_sessions, "consumers": cmd_consumers,
    "purge": cmd_purge, "peek": cmd_peek, "export": cmd_export, "import": cmd_import,
    "accounts": cmd_accounts, "grants": cmd_grants,
}
