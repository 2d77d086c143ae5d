"""Pure wire forms the XMPP door uses (broker/xmpp): a SASL PLAIN message's credentials or
the failure that refuses it (RFC 4616), and the subid of a subscription. Over a socket:
e2e/xmpp (login and subscribe tests)."""

from __future__ import annotations

import pytest

from broker.xmpp import stanzas as s
from broker.xmpp import stream as xs


@pytest.mark.parametrize("message, expected", [
    (b"\0bob\0pw", ("bob", "pw")),
    (b"bob\0bob\0pw", ("bob", "pw")),
    (b"BOB@example.org\0bob\0p\0w", "malformed-request"),  # a NUL in the password: 4 parts
    (b"Bob@Example.org\0bob\0pw", ("bob", "pw")),  # the bare JID, any case
    (b"alice\0bob\0pw", "invalid-authzid"),
    (b"bob@elsewhere.org\0bob\0pw", "invalid-authzid"),
    (b"bob\0pw", "malformed-request"),
    (b"\0bob\0\xff", "malformed-request"),  # not UTF-8
])
def test_plain_credentials(message, expected):
    assert xs.plain_credentials(message, "example.org") == expected


def test_one_subid_per_node_and_selector():
    plain = s.subscription_id(7, "/News", None)
    assert plain == s.subscription_id(7, "/news", ("", ""))  # node ids fold case
    assert plain != s.subscription_id(8, "/news", None)
    sql = s.subscription_id(7, "/news", ("sql", "x > 1"))
    assert sql == s.subscription_id(7, "/news", ("SQL", "x > 1"))  # the class folds case
    assert sql != s.subscription_id(7, "/news", ("SQL", "x > 2"))
    assert len({plain, sql}) == 2 and all(len(i) == 40 for i in (plain, sql))
