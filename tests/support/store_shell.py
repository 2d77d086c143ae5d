"""One Django process kept for a test's checks of the store.

A check in ``manage.py shell`` costs a process start (~2 s of CPU here, more on a loaded
machine), and some checks are polled until they hold. This process runs each check as a new
one would: in a fresh namespace, and with its database connections closed after each, so the
next check reads what is committed then."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.support.timing import scaled

_LOOP = r"""
import json, sys, traceback
import django
django.setup()
from django.db import connections
replies, sys.stdout = sys.stdout, sys.stderr  # what a check prints goes to the log
for line in sys.stdin:
    scope = {}
    try:
        exec(json.loads(line), scope)
        reply = {"result": scope["result"]}
    except BaseException:
        reply = {"error": traceback.format_exc()}
    connections.close_all()
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


class StoreShell:
    """``run(code)``: ``code`` (Python that sets ``result``) run with Django set up on the
    database of ``env``; ``result`` as JSON gives it back."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self._log = log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _LOOP],
            env={**env, "DJANGO_SETTINGS_MODULE": "broker.settings"}, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._log_path = log_path

    def run(self, code: str, timeout: float = 120) -> object:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(code) + "\n")
        self._proc.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + scaled(timeout)
            while not selector.select(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise AssertionError(f"the store shell gave no answer within "
                                         f"{scaled(timeout):.0f} s; log: {self._log_path}")
        line = self._proc.stdout.readline()
        if not line:
            raise AssertionError(f"the store shell ended; log: {self._log_path}\n"
                                 + self._log_path.read_text(errors="replace")[-3000:])
        reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"check failed in the store shell:\n{reply['error']}")
        return reply["result"]

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=scaled(20))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
