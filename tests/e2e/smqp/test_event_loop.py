"""The listener's event loop (``SMQP_EVENT_LOOP``): uvloop unless the standard asyncio loop
is asked for. Every other end-to-end test runs on the default; this one checks that the
default is in use, and that the alternative serves a whole delivery (PUB MESSAGE, its
NOTIFY and the 310 ACK exchange, a GET) over a real socket."""

from __future__ import annotations

import pytest

from tests.conftest import base_env, fresh_listener, run_manage
from tests.support.smqp_session import Session, smuid_of

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("setting", "loop"), [(None, "uvloop"), ("asyncio", "asyncio")])
def test_the_listener_serves_a_delivery_on_the_configured_event_loop(tmp_path, setting, loop):
    extra = {"SMQP_EVENT_LOOP": setting} if setting else {}
    with fresh_listener("sqlite", tmp_path, extra) as broker:
        assert f"({loop} event loop)" in broker.log_path.read_text()
        with Session(broker.host, broker.port, "root") as root, \
                Session(broker.host, broker.port, "root") as sub:
            assert root.command("CREATE TOPIC /loop").code == 200
            assert sub.command("SUB MESSAGE /loop").code == 200
            smuid = smuid_of(root.publish("/loop", "c1", sections=[("text/plain", b"hi")]))
            note = sub.message()
            assert note.message.sections[0].body == b"hi"
            sub.ack()
            assert sub.quiet(0.5)  # delivered once
            reply = root.command(f"GET MESSAGE /loop {smuid}")
            assert reply.code == 200 and reply.lines[-1].endswith("1 messages"), reply


def test_an_unknown_event_loop_is_refused_at_start(tmp_path):
    env = {**base_env(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite3'}"),
           "SMQP_EVENT_LOOP": "tornado"}
    result = run_manage(env, "runsmqp", "--port", "0", check=False)
    assert result.returncode != 0
    assert "SMQP_EVENT_LOOP must be 'uvloop' or 'asyncio'" in result.stderr
