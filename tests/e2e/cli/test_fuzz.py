"""The ``smqp`` client against a server that says anything: whatever bytes come back, the
command ends with a status and at most one ``smqp: error:`` line, never a traceback."""

from __future__ import annotations

import contextlib
import io
import socket
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.cli.main import main
from tests.support.timing import scaled

LINES = st.one_of(
    st.sampled_from([b"200 OK", b"200-OK", b"200 Guid: x1", b"401 No", b"310 ACK", b"",
                     b"NOTIFY MESSAGE /t", b"NOTIFY SERVER BYE", b"Content-Length: 3",
                     b"Content-Length: 99999999999", b".", b"200 c1 7", b"200 c1 x",
                     b"SMQP/1.0 Ready. x", b"SMQP/1.0 Not Available.", b"NOTIFY TOPIC /a",
                     b"Action: ADDED", b"NOTIFY SUB /a", b"Count: -1"]),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
)


def serve(script: bytes) -> tuple[int, threading.Thread]:
    """A one-connection server: sends ``script``, reads until the client goes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def run() -> None:
        with listener:
            listener.settimeout(scaled(5))
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(scaled(1))
                with contextlib.suppress(OSError):
                    conn.sendall(script)
                    conn.shutdown(socket.SHUT_WR)  # then the client reads the end
                    while conn.recv(65536):
                        pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                   HealthCheck.function_scoped_fixture])
@given(greeting=st.booleans(), lines=st.lists(LINES, max_size=12),
       verb=st.sampled_from([["topics"], ["pub", "/t", "x"], ["get", "/t", "1"],
                             ["sub", "/t", "--count", "1"]]))
def test_any_server_reply_ends_in_one_line(monkeypatch, greeting, lines, verb):
    script = (b"SMQP/1.0 Ready. fuzz\r\n" if greeting else b"") + b"".join(
        line + b"\r\n" for line in lines)
    port, thread = serve(script)
    monkeypatch.setenv("SMQP_PASSWORD", "pw")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["--port", str(port), "--account", "bob", "--timeout", "2", *verb])
    thread.join(scaled(5))
    lines_out = [x for x in err.getvalue().splitlines() if x.startswith("smqp: error:")]
    others = [x for x in err.getvalue().splitlines()
              if x and not x.startswith(("smqp: error:", "subscribed to", "── "))]
    assert status in (0, 1, 3, 4)
    assert len(lines_out) <= 1 and not others, err.getvalue()
    assert (status == 0) == (not lines_out)
