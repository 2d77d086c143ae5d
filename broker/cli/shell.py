"""``smqp shell``: an interactive SMQP session with line editing and history (the standard
library's ``readline``, history in ``~/.smqp_history``).

Lines are sent as typed; a thread reads the server and prints replies and notifications as
they come (a message is acknowledged once printed, unless ``--no-auto-ack``). The shell's
own commands start with ``:`` (``:pub TOPIC TEXT`` builds a whole PUB MESSAGE, which is
awkward to type by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from broker.smqp.client import NotifyMessage, Reply, ServerAck

from .connection import CLIError, Connection, describe
from .main import OUTPUT, say, show_event, show_message

HELP = """\
Type SMQP command lines (LIST TOPIC /, SUBSCRIBE MESSAGE /news, GET MESSAGE /news 1-5 ...).
Shell commands:
  :pub TOPIC TEXT   publish TEXT (text/plain) to TOPIC
  :ack              acknowledge the last message (with --no-auto-ack)
  :help             this text
  :quit             QUIT and leave (also Ctrl-D)"""

#: What Tab completes at the start of a line.
COMMANDS = (
    "LIST TOPIC ", "LIST MESSAGE ", "COUNT TOPIC ", "COUNT MESSAGE ", "COUNT SUBSCRIBERS ",
    "CREATE TOPIC ", "REMOVE TOPIC ", "REMOVE MESSAGE ", "SET TOPIC NAME ",
    "SET TOPIC KEYWORDS ", "SET LOGIN ", "SET NOTIFY PORT ", "SET NOTIFY SUSPEND",
    "SET NOTIFY RESUME", "FIND TOPIC ", "SUBSCRIBE MESSAGE ", "SUBSCRIBE TOPIC ",
    "SUBSCRIBE SUBSCRIBERS ", "SUBSCRIBE SERVER TIMEOUT", "UNSUBSCRIBE MESSAGE ",
    "UNSUBSCRIBE TOPIC ", "UNSUBSCRIBE SUBSCRIBERS ", "UNSUBSCRIBE SERVER TIMEOUT",
    "GET MESSAGE ", "GET TOPIC KEYWORDS ", "REPUBLISH MESSAGE ", "NOOP", "QUIT",
    ":pub ", ":ack", ":help", ":quit",
)
HISTORY = os.path.expanduser("~/.smqp_history")
HISTORY_LENGTH = 1000
#: How long output from the server waits for readline to finish writing the prompt. Its
#: pre-input hook ends the wait; only a readline that never calls the hook waits this long.
PROMPT_WAIT = 1.0


class Prompt:
    """The prompt line, shared by the prompt loop and the thread that prints what the server
    sends. ``input()`` writes the prompt and echoes keys outside Python, so a message printed
    meanwhile would land inside the prompt or the half-typed line. Output from the thread
    therefore waits while the prompt is being written, and while a line is being edited it
    clears that line, prints, and writes the prompt and the typed text again below."""

    def __init__(self, text: str, readline: ModuleType | None) -> None:
        self.text = text
        # input() uses readline only with a terminal on both ends.
        usable = (readline is not None and hasattr(readline, "set_pre_input_hook")
                  and sys.stdin.isatty() and sys.stdout.isatty())
        self._readline = readline if usable else None
        self._state = "idle"  # "asking": input() writes the prompt; "editing": keys typed
        self._changed = threading.Condition(OUTPUT)

    def read(self) -> str:
        if self._readline is None:
            return input(self.text)
        with self._changed:
            self._state = "asking"
        self._readline.set_pre_input_hook(self._shown)
        try:
            return input(self.text)
        finally:
            self._readline.set_pre_input_hook(None)
            with self._changed:
                self._state = "idle"
                self._changed.notify_all()

    def _shown(self) -> None:
        """readline's pre-input hook: the prompt is on the screen, keys come next."""
        with self._changed:
            self._state = "editing"
            self._changed.notify_all()

    @contextlib.contextmanager
    def above(self) -> Iterator[None]:
        """Hold the terminal for a block of output, printed above the line being typed."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._state != "asking",
                                          timeout=PROMPT_WAIT):
                self._state = "editing"  # no hook came: take the prompt as written
            editing = self._readline is not None and self._state == "editing"
            if editing:
                sys.stdout.write("\r\x1b[K")  # back to the column 0, the line erased
            yield
            if editing:
                sys.stdout.write(self.text + self._readline.get_line_buffer())
                sys.stdout.flush()


def run_shell(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Connection]
              ) -> int:
    try:
        import readline
    except ImportError:  # not on every platform: the shell works without editing
        readline = None  # type: ignore[assignment]
    if readline is not None:
        with contextlib.suppress(OSError):
            readline.read_history_file(HISTORY)
        readline.set_history_length(HISTORY_LENGTH)
        _complete_commands(readline)
    known = readline.get_current_history_length() if readline is not None else 0
    conn = connect(args)
    replies: queue.Queue[Reply | CLIError] = queue.Queue()
    auto_ack = not args.no_auto_ack
    prompt = Prompt("smqp> ", readline)
    say(f"connected to {args.host}:{args.port} as {conn.guid}; :help for help")

    def reader() -> None:
        try:
            while True:
                event = conn.next_event(timeout=3600)
                if isinstance(event, Reply):
                    replies.put(event)
                elif isinstance(event, NotifyMessage):
                    with prompt.above():
                        show_message(args, event)
                        if auto_ack:
                            conn.ack()
                            say("(acknowledged)")
                elif not isinstance(event, ServerAck):
                    with prompt.above():
                        show_event(args, event)
        except TimeoutError:
            replies.put(CLIError("no word from the server for an hour", 3))
        except CLIError as exc:
            replies.put(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()

    def wait_reply() -> Reply:
        item = replies.get(timeout=args.timeout)
        if isinstance(item, CLIError):
            raise item
        return item

    status = 0
    try:
        while True:
            try:
                line = prompt.read().strip()
            except EOFError:
                line = ":quit"
            if not line:
                continue
            try:
                if line.startswith(":"):
                    word, _, rest = line[1:].partition(" ")
                    word = word.lower()
                    if word in ("quit", "q", "exit"):
                        conn.send(b"QUIT\r\n")
                        say(describe(wait_reply()))
                        break
                    if word == "help":
                        say(HELP)
                    elif word == "ack":
                        conn.ack()
                    elif word == "pub":
                        topic, _, text = rest.strip().partition(" ")
                        if not topic:
                            say("usage: :pub TOPIC TEXT")
                            continue
                        from broker.smqp import commands as c
                        from broker.smqp.message import DataSection, Message

                        msg = Message([], [DataSection([("Content-Type", "text/plain")],
                                                       text.encode())])
                        conn.send(c.serialize_command(
                            c.Publish("MESSAGE", topic, uuid.uuid4().hex[:16], msg)))
                        say(describe(wait_reply()))
                    else:
                        say(f"unknown shell command :{word} (:help)")
                    continue
                if line.split(" ", 1)[0].upper() in ("PUB", "PUBLISH"):
                    say("a PUB needs its message: use :pub TOPIC TEXT")
                    continue
                conn.send(line.encode() + b"\r\n")
                reply = wait_reply()
                last = len(reply.lines) - 1
                say("\n".join(f"{reply.code}{' ' if i == last else '-'}{text}"
                               for i, text in enumerate(reply.lines)))
                for msg in reply.messages:
                    show_message(args, None, msg)
                if line.upper() == "QUIT":
                    break
            except queue.Empty:
                say("smqp: error: no reply from the server in time", sys.stderr)
            except ValueError as exc:
                say(f"smqp: error: cannot send that: {exc}", sys.stderr)
    except CLIError as exc:
        say(f"smqp: error: {exc}", sys.stderr)
        status = exc.status
    except KeyboardInterrupt:
        status = 130
    finally:
        conn.close()
        if readline is not None:
            # Appended, not rewritten: two shells at once each keep their own lines.
            with contextlib.suppress(OSError):
                Path(HISTORY).touch(mode=0o600)
                readline.append_history_file(
                    readline.get_current_history_length() - known, HISTORY)
    return status


def _complete_commands(readline: ModuleType) -> None:
    """Tab completes the command words (upper case, as the profile writes them)."""

    def complete(text: str, state: int) -> str | None:
        line = readline.get_line_buffer()
        begin = readline.get_begidx()
        typed = line[:begin].upper() + text.upper()
        matches = [c[begin:] for c in COMMANDS if c.startswith(typed)]
        return matches[state] if state < len(matches) else None

    readline.set_completer_delims(" ")
    readline.set_completer(complete)
    # libedit (macOS) and GNU readline spell the binding differently.
    if "libedit" in (readline.__doc__ or ""):
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
