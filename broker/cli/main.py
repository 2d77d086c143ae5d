"""``smqp``: the command-line client (``smqp pub``, ``sub``, ``get``, ``topics``, ``shell``,
and ``admin``: the operators' commands over the REST API, :mod:`.admin`).

Every subcommand connects, logs in with SCRAM-SHA-256/1.0 (SCRAM-SHA-256-PLUS over TLS;
``--auth clear`` for CLEAR/1.0; the password from ``SMQP_PASSWORD`` or a prompt), does its
work and QUITs. Output is for people, or one JSON object per line with
``--json``. An error is one line on stderr, ``smqp: error: ...``, with a non-zero exit
status: 1 refused by the server, 2 wrong usage, 3 no connection (or it broke), 4 login
failed.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import sys
import threading
import uuid
from collections.abc import Callable

from broker.smqp.client import NotifyMessage, NotifyServer, NotifySub, NotifyTopic, ServerAck

from . import admin
from .connection import CLIError, Connection, describe, message_dict

DEFAULT_PORT = 720
DEFAULT_TLS_PORT = 7443


def _connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes, before or after its name. After it (``suppress``)
    they default to nothing, so that they do not undo the same option given before it."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    g = parser.add_argument_group("connection")
    g.add_argument("--host", default=default(os.environ.get("SMQP_HOST", "127.0.0.1")),
                   help="server address (SMQP_HOST; default 127.0.0.1)")
    g.add_argument("--port", type=int, default=default(None),
                   help=f"server port (SMQP_PORT; default {DEFAULT_PORT}, "
                        f"{DEFAULT_TLS_PORT} with --tls)")
    g.add_argument("--tls", action="store_true", default=default(False),
                   help="connect with TLS (SMQPS)")
    g.add_argument("--cafile", default=default(None),
                   help="CA certificates (PEM) to verify the server with")
    g.add_argument("--account", "-a", default=default(os.environ.get("SMQP_ACCOUNT")),
                   help="account to log in as (SMQP_ACCOUNT; default: your user name); the "
                        "password comes from SMQP_PASSWORD or a prompt")
    g.add_argument("--auth", choices=["scram", "clear"],
                   default=default(os.environ.get("SMQP_AUTH", "scram").lower()),
                   help="login method (SMQP_AUTH): scram, SCRAM-SHA-256 (-PLUS over TLS), "
                        "the password never sent (default); clear, CLEAR/1.0")
    g.add_argument("--json", action="store_true", default=default(False),
                   help="one JSON object per line")
    g.add_argument("--timeout", type=float, default=default(30.0),
                   help="seconds to wait for the server (default 30)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, suppress=True)
    parser = argparse.ArgumentParser(
        prog="smqp", description="Command-line client for SMQP brokers.")
    _connection_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    p = sub.add_parser("pub", parents=[common], help="publish a message",
                       description="Publish one message; its data is TEXT, or stdin when "
                                   "TEXT is - or missing.")
    p.add_argument("topic")
    p.add_argument("text", nargs="?", default="-")
    p.add_argument("--type", default="text/plain", help="Content-Type (default text/plain)")
    p.add_argument("--cmuid", help="your message id (default: a random one)")
    p.add_argument("--header", "-H", action="append", default=[], metavar="NAME=VALUE",
                   help="a header attribute (Name, Priority, Timeout, Receipt ...); repeatable")

    s = sub.add_parser("sub", parents=[common], help="subscribe, print messages as they "
                       "arrive, acknowledge each", description="Subscribe the account to "
                       "TOPICs (a subscription lasts until UNSUBSCRIBE) and print messages as "
                       "they arrive; each is acknowledged once printed. Ctrl-C ends.")
    s.add_argument("topics", nargs="+", metavar="TOPIC", help="a topic, or /a/b/* for a subtree")
    s.add_argument("--count", "-n", type=int, default=0,
                   help="exit after this many messages (default: run until interrupted)")
    s.add_argument("--wait", type=float, default=0,
                   help="exit after this many seconds without a message (default: never)")
    s.add_argument("--selector", metavar="'CLASS TEXT'",
                   help="only messages this selector is TRUE for: JMS Priority < 3, or "
                        "LDAP (&(x-region=eu)(priority<=2)) (profile 9.2)")
    s.add_argument("--lease", metavar="TIMEOUT",
                   help="the subscription ends after this long (HH:MM:SS); subscribing "
                        "again renews it (profile 9.3)")
    s.add_argument("--window", type=int, default=1, metavar="N",
                   help="let up to N messages come before their acknowledgements (SET NOTIFY "
                        "WINDOW, profile 9.7; at most the server's Max-Window). Default 1. "
                        "With --count, those that came after the last counted one are not "
                        "acknowledged: they come again to the account's next session")

    g2 = sub.add_parser("get", parents=[common], help="read stored messages",
                        description="GET MESSAGE: messages of TOPIC by smuid (5, 5-9, "
                                    "1,4-6); TOPIC/Trash for removed ones.")
    g2.add_argument("topic")
    g2.add_argument("smuids")

    t = sub.add_parser("topics", parents=[common], help="list the topics under TOPIC",
                       description="LIST TOPIC: the topics directly under TOPIC (default /).")
    t.add_argument("topic", nargs="?", default="/")

    sh = sub.add_parser("shell", parents=[common], help="an interactive session",
                        description="Type SMQP command lines; replies and notifications are "
                                    "printed as they come. :help lists the shell's own "
                                    "commands. History is kept in ~/.smqp_history.")
    sh.add_argument("--no-auto-ack", action="store_true",
                    help="do not acknowledge messages by itself (type :ack)")
    admin.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.port is None:
        env_port = os.environ.get("SMQP_PORT")
        args.port = int(env_port) if env_port else (DEFAULT_TLS_PORT if args.tls
                                                    else DEFAULT_PORT)
    verbs: dict[str, Callable[[argparse.Namespace, Connection], int]] = {
        "pub": cmd_pub, "sub": cmd_sub, "get": cmd_get, "topics": cmd_topics,
    }
    try:
        if args.verb == "admin":
            return admin.run(args)
        if args.verb == "shell":
            from .shell import run_shell

            return run_shell(args, connect)
        with connect(args) as conn:
            status = verbs[args.verb](args, conn)
            _quit(conn)
            return status
    except CLIError as exc:
        _error(str(exc))
        return exc.status
    except TimeoutError:
        _error(f"no answer from {args.host}:{args.port} within {args.timeout:g} s")
        return 3
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `smqp sub | head`
        return 0
    except Exception as exc:  # a bug, or a server this client does not understand: one line
        _error(f"unexpected {type(exc).__name__}: {exc}")
        return 3


def connect(args: argparse.Namespace) -> Connection:
    account = args.account or getpass.getuser()
    password = os.environ.get("SMQP_PASSWORD")
    if password is None:
        if not sys.stdin.isatty():
            raise CLIError("no password: set SMQP_PASSWORD or run in a terminal", 2)
        password = getpass.getpass(f"Password for {account}: ")
    conn = Connection(args.host, args.port, tls=args.tls, cafile=args.cafile,
                      timeout=args.timeout)
    try:
        conn.login(account, password, getattr(args, "auth", "scram"))
    except BaseException:
        conn.close()
        raise
    return conn


def _quit(conn: Connection) -> None:
    with contextlib.suppress(CLIError):  # already gone: nothing was pending
        conn.command("QUIT")


#: Held for each block written; re-entrant so that ``smqp shell`` can hold it around a block
#: to clear and redraw the line being typed (shell.py).
OUTPUT = threading.RLock()
#: Control characters of a message body shown as escapes (a CR would send the cursor back
#: over the line; an escape sequence would drive the terminal).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def say(text: str, file=None) -> None:
    """One block of output in one write, under a lock, ending with a newline: the shell's
    reader thread (messages) and its prompt loop (replies) never share a line, so a body is
    never run into the next reply."""
    stream = file if file is not None else sys.stdout
    with OUTPUT:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()


def _error(text: str) -> None:
    say(f"smqp: error: {text}", sys.stderr)


def _warn(text: str) -> None:
    say(f"smqp: warning: {text}", sys.stderr)


def _out(args: argparse.Namespace, obj: dict, text: str) -> None:
    say(json.dumps(obj) if args.json else text)


def _visible(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# -------------------------------------------------------------------------------- verbs


def cmd_pub(args: argparse.Namespace, conn: Connection) -> int:
    body = sys.stdin.buffer.read() if args.text == "-" else args.text.encode()
    headers = []
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CLIError(f"--header wants NAME=VALUE, not {item!r}", 2)
        headers.append((name.strip(), value.strip()))
    cmuid = args.cmuid or uuid.uuid4().hex[:16]
    reply = conn.publish(args.topic, cmuid, [(args.type, body)], headers)
    if reply.code != 200:
        raise CLIError(f"publish to {args.topic} refused: {describe(reply)}", 1)
    words = reply.lines[-1].split()
    if not words or not words[-1].isdigit():
        raise CLIError(f"published, but the reply names no message number: {describe(reply)}",
                       3)
    smuid = words[-1]
    _out(args, {"topic": args.topic, "cmuid": cmuid, "smuid": int(smuid)},
         f"published to {args.topic}: smuid {smuid}, cmuid {cmuid}")
    return 0


def _covers(pattern: str, topic: str) -> bool:
    """Does a subscription pattern (/a/b, /a/*) cover the topic? Case-insensitive, as the
    server compares topic paths."""
    pattern, topic = pattern.casefold(), topic.casefold()
    if pattern.endswith("/*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


def cmd_sub(args: argparse.Namespace, conn: Connection) -> int:
    extra = ""
    if args.lease:
        if any(c.isspace() for c in args.lease):
            raise CLIError("--lease takes one timeout (HH:MM:SS)", 2)
        extra += f" LEASE {args.lease}"
    if args.selector:
        klass, _, text = args.selector.strip().partition(" ")
        if not text.strip():
            raise CLIError("--selector wants 'CLASS TEXT' (JMS, RFC-2254 or LDAP, then the "
                           "selector)", 2)
        if "\r" in text or "\n" in text:
            raise CLIError("--selector must be one line", 2)
        extra += f" SELECTOR {klass} {text.strip()}"
    if args.window < 1:
        raise CLIError("--window wants a number from 1", 2)
    if args.window > 1:
        conn.checked(f"SET NOTIFY WINDOW {args.window}")
    for topic in args.topics:
        if any(c.isspace() for c in topic):
            raise CLIError(f"not a topic: {topic!r}", 2)
        conn.checked(f"SUBSCRIBE MESSAGE {topic}{extra}")
    # On stderr, with --json too: a script may wait for it before it publishes.
    say(f"subscribed to {', '.join(args.topics)} as {conn.guid}; waiting for messages",
        sys.stderr)
    warned: set[str] = set()
    seen = 0
    while not args.count or seen < args.count:
        try:
            event = conn.notification(args.wait or None)
        except TimeoutError:
            if args.wait:
                break
            continue
        if isinstance(event, NotifyMessage):
            key = event.topic.casefold()
            if key not in warned and not any(_covers(t, event.topic) for t in args.topics):
                # Messages are the account's, not the session's: any session of it gets
                # those of all its subscriptions, and this one ACKs (consumes) them.
                warned.add(key)
                _warn(f"{event.topic} comes through another subscription of "
                      f"{conn.account} (not one of "
                      f"the topics given); it is shown and acknowledged here like the "
                      f"others, so it is consumed for every session of the account. "
                      f"UNSUBSCRIBE it (smqp shell) or use another account to keep it.")
            show_message(args, event)
            # Only once it is printed (flushed): a message is never lost. With a window,
            # by its smuid: those that came meanwhile wait for theirs.
            conn.ack(_smuid_number(event) if args.window > 1 else None)
            seen += 1
        elif isinstance(event, ServerAck):
            continue
        else:
            show_event(args, event)
    # The last ACK's 310 ACK comes before QUIT's reply; reply() skips it.
    return 0


def _smuid_number(event: NotifyMessage) -> int | None:
    """The number of a NOTIFY's ``Smuid: host/number`` header (None when unreadable: the
    bare ACK then answers the oldest)."""
    number = (event.message.get("Smuid") or "").rpartition("/")[2]
    return int(number) if number.isdigit() else None


def cmd_get(args: argparse.Namespace, conn: Connection) -> int:
    reply = conn.checked(f"GET MESSAGE {args.topic} {args.smuids}")
    for msg in reply.messages:
        show_message(args, None, msg, args.topic)
    if not args.json:
        say(reply.lines[-1], sys.stderr)
    return 0


def cmd_topics(args: argparse.Namespace, conn: Connection) -> int:
    reply = conn.checked(f"LIST TOPIC {args.topic}")
    names = [line for line in reply.lines[1:] if line and line != "0 topics"]
    if args.json:
        _out(args, {"topic": args.topic, "topics": names}, "")
    else:
        if names:
            say("\n".join(names))
        else:
            say(f"no topics under {args.topic}", sys.stderr)
    return 0


# ------------------------------------------------------------------------------ output


def show_message(args: argparse.Namespace, event: NotifyMessage | None, msg=None,
                 topic: str | None = None) -> None:
    msg = event.message if event is not None else msg
    d = message_dict(event, msg, topic)
    if args.json:
        say(json.dumps(d))
        return
    lines = [f"── {d['topic']}  smuid {d['smuid']}  cmuid {d['cmuid']}"]
    for name, value in msg.headers:
        if name not in ("Smuid", "Cmuid", "Topic"):
            lines.append(f"   {name}: {_visible(value)}")
    for section in d["sections"]:
        if "text" in section:
            lines.append(_visible(section["text"]).rstrip("\n"))
        else:
            lines.append(f"[{section['length']} bytes of {section['content_type']}]")
    say("\n".join(lines))


def show_event(args: argparse.Namespace, event: object) -> None:
    if isinstance(event, NotifyTopic):
        obj = {"notify": "topic", "topic": event.topic, "action": event.action,
               "value": event.value}
        text = f"topic {event.topic}: {event.action} {event.value or ''}".rstrip()
    elif isinstance(event, NotifySub):
        obj = {"notify": "subscribers", "topic": event.topic, "count": event.count}
        text = f"subscribers of {event.topic}: {event.count}"
    elif isinstance(event, NotifyServer):
        obj = {"notify": "server", "kind": event.kind, "timeout": event.timeout}
        text = f"server: {event.kind} {event.timeout if event.timeout is not None else ''}"
    else:
        obj, text = {"notify": repr(event)}, repr(event)
    _out(args, obj, text.rstrip())


if __name__ == "__main__":
    sys.exit(main())
