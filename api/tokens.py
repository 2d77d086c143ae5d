"""Making and checking bearer tokens (``smqp_<key id>_<secret>``)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import re
import secrets
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from accounts.models import Account

from .models import ApiToken

TOKEN_RE = re.compile(r"smqp_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})")
#: last_used is written at most this often per token (not one UPDATE per request).
LAST_USED_EVERY = timedelta(minutes=1)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(account: Account, name: str, days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for ``account`` valid ``days`` (``SMQP_API_TOKEN_DAYS`` by default):
    the row and the token text, which is not stored and cannot be shown again."""
    days = settings.SMQP_API_TOKEN_DAYS if days is None else days
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(account=account, name=name[:100], key_id=key_id,
                                    digest=_digest(secret),
                                    expires=timezone.now() + timedelta(days=days))
    return token, f"smqp_{key_id}_{secret}"


def check_token(text: str) -> ApiToken | None:
    """The active token ``text`` is, of an active account, or None. A copy of its own for
    the caller (the rows read are shared by the threads of the process for
    ``SMQP_API_TOKEN_CACHE_SECONDS``)."""
    match = TOKEN_RE.fullmatch(text)
    if match is None:
        return None
    key_id, secret = match.groups()
    token = _checked(key_id)
    if token is None or not hmac.compare_digest(token.digest, _digest(secret)):
        return None
    now = timezone.now()
    if token.revoked is not None or token.expires <= now or not token.account.is_active:
        return None
    if token.last_used is None or now - token.last_used > LAST_USED_EVERY:
        token.last_used = now
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    mine = copy.copy(token)
    mine.account = copy.copy(token.account)
    return mine


#: key_id → (when read, monotonic; the row with its account) of tokens read lately.
_recent: dict[str, tuple[float, ApiToken]] = {}
#: Past this many, the remembered rows are all dropped (rows of many tokens at once).
RECENT_MAX = 10_000


def _checked(key_id: str) -> ApiToken | None:
    """The token row of ``key_id`` with its account, read at most
    ``SMQP_API_TOKEN_CACHE_SECONDS`` ago (remembered only when it exists)."""
    now = time.monotonic()
    hit = _recent.get(key_id)
    if hit is not None and now - hit[0] < settings.SMQP_API_TOKEN_CACHE_SECONDS:
        return hit[1]
    token = ApiToken.objects.select_related("account").filter(key_id=key_id).first()
    if token is None:
        _recent.pop(key_id, None)
        return None
    if len(_recent) >= RECENT_MAX:
        _recent.clear()
    _recent[key_id] = (now, token)
    return token


def forget_checked(**_: object) -> None:
    """Read every token again at its next use: a token or an account changed in this
    process (a signal receiver, see :class:`api.apps.ApiConfig`)."""
    _recent.clear()


def revoke(token: ApiToken) -> None:
    if token.revoked is None:
        ApiToken.objects.filter(pk=token.pk, revoked__isnull=True).update(revoked=timezone.now())
    forget_checked()
