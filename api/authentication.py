"""``Authorization: Bearer smqp_...``: an account's API token (:mod:`.tokens`). Failed
attempts count against the client's address exactly as failed SMQP logins do
(:mod:`broker.services.auth`): after a few, a failure is answered 429 with a Retry-After;
after more, the address is locked out (429) for the lockout period, whatever it sends."""

from __future__ import annotations

import math
import time

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from broker.services import auth as auth_service

from .tokens import check_token


def peer_of(request: Request) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


#: An address whose throttle was read as clear with a good token is not read again for this
#: long while its tokens stay good (not a Redis round trip per request): any failure from it
#: reads the throttle, and a lockout by failures sent to another process stops its good
#: tokens within this time.
CLEAR_SECONDS = 1.0
#: address → when (monotonic) its throttle was read as clear.
_clear: dict[str, float] = {}


def _clear_lately(peer: str) -> bool:
    seen = _clear.get(peer)
    return seen is not None and time.monotonic() - seen < CLEAR_SECONDS


class Throttled(exceptions.Throttled):
    default_detail = "Too many failed attempts from this address."


class BearerAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request):
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() != self.keyword.lower().encode():
            return None
        if len(auth) != 2:
            raise exceptions.AuthenticationFailed("Malformed bearer token header.")
        try:
            text = auth[1].decode("ascii")
        except UnicodeDecodeError:
            text = ""
        peer = peer_of(request)
        throttle = None if _clear_lately(peer) else auth_service.token_throttle(peer)
        if throttle is not None and throttle.refused:
            raise Throttled(wait=None)
        token = check_token(text)
        if token is None:
            _clear.pop(peer, None)
            throttle = throttle or auth_service.token_throttle(peer)
            auth_service.record_token_failure(peer, text[:21])
            if throttle.refused:
                raise Throttled(wait=None)
            if throttle.delay > 0:
                raise Throttled(wait=math.ceil(throttle.delay))
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        if throttle is not None and throttle.delay <= 0:
            if len(_clear) >= 10_000:  # many addresses: start again
                _clear.clear()
            _clear[peer] = time.monotonic()
        return token.account, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
