"""Bearer tokens as the REST door checks them (api.tokens): a token checked lately is not
read again (no query per request) for SMQP_API_TOKEN_CACHE_SECONDS, but a revocation or a
change of its account made in this process takes effect at once; one made by another
process (a raw UPDATE here) takes effect once that time has passed. Over HTTP:
e2e/rest/test_api (revocation through the API and the admin)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api import tokens
from api.models import ApiToken
from tests.support.factories import make_account


@pytest.fixture
def token(db):
    tokens.forget_checked()
    row, text = tokens.create_token(make_account("bob"), "t")
    assert tokens.check_token(text) is not None  # read once (and last_used written)
    yield row, text
    tokens.forget_checked()


def test_a_token_checked_lately_is_not_read_again(token):
    _, text = token
    with CaptureQueriesContext(connection) as captured:
        got = tokens.check_token(text)
    assert got is not None and got.account.username == "bob"
    assert captured.captured_queries == []
    assert tokens.check_token(text[:-1] + ("A" if text[-1] != "A" else "B")) is None


def test_each_caller_gets_a_copy_of_its_own(token):
    _, text = token
    mine = tokens.check_token(text)
    mine.account.username = "changed by a view"
    assert tokens.check_token(text).account.username == "bob"


def test_a_revocation_here_takes_effect_at_once(token):
    row, text = token
    tokens.revoke(row)
    assert tokens.check_token(text) is None


def test_a_deactivated_account_or_a_deleted_token_here_takes_effect_at_once(token):
    row, text = token
    account = row.account
    account.is_active = False
    account.save()
    assert tokens.check_token(text) is None
    account.is_active = True
    account.save()
    assert tokens.check_token(text) is not None
    row.delete()
    assert tokens.check_token(text) is None


def test_a_revocation_elsewhere_takes_effect_once_the_cache_time_has_passed(token, settings):
    row, text = token
    ApiToken.objects.filter(pk=row.pk).update(revoked=row.created)  # as another process
    settings.SMQP_API_TOKEN_CACHE_SECONDS = 3600
    assert tokens.check_token(text) is not None  # trusted for the cache time
    settings.SMQP_API_TOKEN_CACHE_SECONDS = 0
    assert tokens.check_token(text) is None
