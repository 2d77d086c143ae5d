"""Issue 23: failed XMPP logins are throttled as SMQP's are (the same per-address count, in
the shared cache): past SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT the address is refused, even with
the right password, at both doors."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_listener
from tests.e2e.xmpp.test_xmpp import SETUP
from tests.support.smqp_session import Session as SmqpSession
from tests.support.xmpp_session import SASL, XmppSession, daphne, tag

pytestmark = pytest.mark.e2e


def test_failed_logins_lock_the_address_out_at_both_doors(tmp_path):
    extra = {"SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT": "3", "SMQP_LOGIN_FAILURES_BEFORE_DELAY": "10",
             "SMQP_PBKDF2_ITERATIONS": "4096"}
    with fresh_listener("postgres", tmp_path, extra, setup=SETUP) as broker, \
            daphne(broker.env, tmp_path) as url:
        s = XmppSession(url)
        s.open()
        for _ in range(3):
            assert s.auth_plain("bob", "wrong").tag == tag(SASL, "failure")
        refused = s.auth_plain("bob", "pw")
        assert refused.tag == tag(SASL, "failure")
        assert refused.find(tag(SASL, "temporary-auth-failure")) is not None
        assert s.auth_scram("bob", "pw").tag == tag(SASL, "failure")
        s.close()
        # The same address is refused by the SMQP door too (one count).
        with SmqpSession(broker.host, broker.port) as smqp:
            assert smqp.command("LOGIN bob CLEAR/1.0").code == 200
            reply = smqp.command("PASS bob pw")
            assert reply.code == 401 and "too many" in " ".join(reply.lines)
