"""Rows the unit tests make over and over."""

from __future__ import annotations

from accounts.models import Account


def make_account(name: str, **kw) -> Account:
    """An account with the password ``pw`` (and so its account topic)."""
    account = Account(username=name, **kw)
    account.set_password("pw")
    account.save()
    return account
