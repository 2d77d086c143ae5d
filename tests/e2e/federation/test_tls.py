"""Federation (profile §9.5) over SMQPS: B's link to A connects to A's TLS listener and checks
A's certificate against the CA the link names; a link that trusts another CA does not log in
(its last error says why) and receives nothing."""

from __future__ import annotations

import pytest
import trustme

from tests.e2e.federation.test_triangle import publish, state, subscribe, wait_subscribed
from tests.support.federation_net import prepared, wait_for
from tests.support.smqp_session import header

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LINK = """
from broker.models import Link
Link.objects.create(name={name!r}, host='127.0.0.1', port={port}, account='peer_b',
                    password='pw', imports='/*', tls=True, tls_ca={ca!r},
                    tls_server_name='localhost')
"""


def test_a_link_over_smqps_checks_the_peers_certificate(tmp_path):
    ca, other = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    pem = tmp_path / "a.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca_file, other_file = tmp_path / "ca.pem", tmp_path / "other.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    other.cert_pem.write_to_path(str(other_file))
    with prepared("sqlite", tmp_path, ("a", "b")) as domains:
        a, b = domains["a"], domains["b"]
        a.env = {**a.env, "SMQP_TLS_CERT": str(pem), "SMQP_TLS_KEY": str(pem)}
        a.start_listener(tls=True)
        b.start_listener()
        tls_port = a.extra["tls_port"]
        b.shell(LINK.format(name="a", port=tls_port, ca=str(ca_file)))
        b.shell(LINK.format(name="x", port=tls_port, ca=str(other_file)))
        b.start_links()
        on_b = subscribe(b, "/a/news/d1")
        wait_subscribed(b, "a", "/news/d1")
        [smuid] = publish(a, "/news/d1", 1, tag="tls")
        msg = on_b.message(timeout=120)
        assert header(msg, "X-Origin") == f"a.test/{smuid}"
        on_b.ack()
        assert state(b)["a"]["state"] == "up"
        untrusted = wait_for(lambda: state(b)["x"]["last_error"], 120, "link x to fail")
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted or "certificate" in untrusted.lower()
        assert state(b)["x"]["state"] in ("down", "connecting")
        # A link removed withdraws what it subscribed to on the peer.
        peer_subs = ("SELECT count(*) FROM broker_subscription s JOIN accounts_account a ON "
                     "a.id = s.account_id WHERE a.username = 'peer_b'")
        assert a.sql(peer_subs) == [(1,)]
        b.shell("from broker.models import Link\nLink.objects.filter(name='a').delete()")
        wait_for(lambda: a.sql(peer_subs) == [(0,)], 120, "the subscription withdrawn on A")
        on_b.close()
