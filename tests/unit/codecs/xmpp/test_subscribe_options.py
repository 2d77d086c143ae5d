"""The XMPP subscribe options that map to SMQP's SELECTOR and LEASE (profile §9.2, §9.3):
``pubsub#selector`` = ``<class> <text>`` and ``pubsub#expire`` (XEP-0060: a date-time; a
number of seconds is taken too)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.services import ServiceError
from broker.services import pubsub as ps

NOW = datetime(2026, 11, 25, 0, 0, 0, tzinfo=UTC)


def test_selector_option():
    assert ps.selector_of(None) is None
    assert ps.selector_of({ps.SELECTOR: ["  "]}) is None
    assert ps.selector_of({ps.SELECTOR: ["JMS  X_N > 2 "]}) == ("JMS", "X_N > 2")
    assert ps.selector_of({ps.SELECTOR: ["LDAP (a=b)"]}) == ("LDAP", "(a=b)")
    with pytest.raises(ServiceError) as refused:
        ps.selector_of({ps.SELECTOR: ["JMS"]})
    assert refused.value.code == 400


def test_expire_option():
    assert ps.lease_of({}, NOW) is None
    assert ps.lease_of({ps.EXPIRE: ["30"]}, NOW) == 30
    end = (NOW + timedelta(seconds=2, milliseconds=100)).isoformat()
    assert ps.lease_of({ps.EXPIRE: [end]}, NOW) == 3  # rounded up: never shorter
    assert ps.lease_of({ps.EXPIRE: ["2026-11-25T00:01:00Z"]}, NOW) == 60
    assert ps.lease_of({ps.EXPIRE: ["2026-11-25T00:01:00"]}, NOW) == 60  # naive: UTC
    for bad in ("0", "-5", "soon", "2026-11-24T23:59:59Z", str(ps.MAX_LEASE + 1)):
        with pytest.raises(ServiceError) as refused:
            ps.lease_of({ps.EXPIRE: [bad]}, NOW)
        assert refused.value.code == 400, bad


@given(st.text(max_size=60))
def test_any_expire_text_is_a_lease_or_400(text):
    try:
        lease = ps.lease_of({ps.EXPIRE: [text]}, NOW)
    except ServiceError as exc:
        assert exc.code == 400
    else:
        assert lease is None or 0 < lease <= ps.MAX_LEASE
