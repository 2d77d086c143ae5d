"""Making and checking bearer tokens (``smqp_<key id>_<secret>``)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
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
    """The active token ``text`` is, of an active account, or None."""
    match = TOKEN_RE.fullmatch(text)
    if match is None:
        return None
    key_id, secret = match.groups()
    token = ApiToken.objects.select_related("account").filter(key_id=key_id).first()
    if token is None or not hmac.compare_digest(token.digest, _digest(secret)):
        return None
    now = timezone.now()
    if token.revoked is not None or token.expires <= now or not token.account.is_active:
        return None
    if token.last_used is None or now - token.last_used > LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token


def revoke(token: ApiToken) -> None:
    if token.revoked is None:
        ApiToken.objects.filter(pk=token.pk, revoked__isnull=True).update(revoked=timezone.now())
