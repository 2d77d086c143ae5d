"""``Authorization: Bearer smqp_...``: an account's API token (:mod:`.tokens`). Failed
attempts count against the client's address exactly as failed SMQP logins do
(:mod:`broker.services.auth`): after a few, a failure is answered 429 with a Retry-After;
after more, the address is locked out (429) for the lockout period, whatever it sends."""

from __future__ import annotations

import math

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from broker.services import auth as auth_service

from .tokens import check_token


def peer_of(request: Request) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


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
        throttle = auth_service.token_throttle(peer)
        if throttle.refused:
            raise Throttled(wait=None)
        token = check_token(text)
        if token is None:
            auth_service.record_token_failure(peer, text[:21])
            if throttle.delay > 0:
                raise Throttled(wait=math.ceil(throttle.delay))
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.account, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
