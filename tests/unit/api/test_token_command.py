"""``manage.py token`` (create, list, revoke), the operators' way to REST bearer tokens, run
in process (``call_command``): what it prints, and its refusals."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from api import tokens
from api.models import ApiToken
from tests.support.factories import make_account

pytestmark = pytest.mark.django_db


def token(*args: str) -> str:
    out = StringIO()
    call_command("token", *args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def fresh_token_cache():
    tokens.forget_checked()
    yield
    tokens.forget_checked()


def test_create_list_and_revoke():
    make_account("Bob")
    make_account("carol")
    text = token("create", "bob", "ci", "--days", "3").strip()
    assert tokens.check_token(text).account.username == "Bob"
    token("create", "carol", "nightly")
    stale = ApiToken.objects.get(name="nightly")
    ApiToken.objects.filter(pk=stale.pk).update(expires=timezone.now() - timedelta(days=1))
    ci = ApiToken.objects.get(name="ci")
    assert timedelta(days=2, hours=23) < ci.expires - timezone.now() <= timedelta(days=3)

    rows = [line.split("\t") for line in token("list").splitlines()]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (str(ci.pk), "Bob", "ci", "active"), (str(stale.pk), "carol", "nightly", "expired")]
    assert all(r[4].startswith("expires ") for r in rows)
    # Listed by account name, case-insensitively; the secret is never shown again.
    assert [r.split("\t")[2] for r in token("list", "BOB").splitlines()] == ["ci"]
    assert text not in token("list")

    assert token("revoke", str(ci.pk)).strip() == f"token {ci.pk} revoked"
    assert tokens.check_token(text) is None
    assert token("list", "bob").split("\t")[3] == "revoked"


def test_refusals():
    make_account("bob")
    with pytest.raises(CommandError, match="no account 'nobody'"):
        token("create", "nobody", "x")
    with pytest.raises(CommandError, match="--days must be at least 1"):
        token("create", "bob", "x", "--days", "0")
    with pytest.raises(CommandError, match="no token 4242"):
        token("revoke", "4242")
    assert not ApiToken.objects.exists()
