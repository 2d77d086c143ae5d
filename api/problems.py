"""RFC 9457 problem details for every refusal, with ``smqp_code``: the SMQP reply code the
same refusal gets on the wire. Services refuse with :class:`broker.services.ServiceError`
(an SMQP code); this maps it to the HTTP status an HTTP client expects."""

from __future__ import annotations

import logging
from http import HTTPStatus

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from broker.domain.errors import ProtocolError
from broker.services import ServiceError

logger = logging.getLogger("api")

PROBLEM = "application/problem+json"

#: SMQP reply code → HTTP status. SMQP's 401 is "no right" for a logged-in account: HTTP's
#: 403 (HTTP's 401 asks for credentials). 405 refuses an operation on that topic kind;
#: 406 and 409 are states that forbid it; 414 is a size or count limit; 510 a quantity.
HTTP_STATUS = {400: 400, 401: 403, 404: 404, 405: 403, 406: 409, 409: 409, 414: 413,
               510: 422}

#: HTTP status of DRF's own refusals → the SMQP code of the nearest SMQP refusal.
SMQP_CODE = {400: 400, 401: 530, 403: 401, 404: 404, 405: 400, 406: 400, 409: 409, 413: 414,
             415: 400, 422: 400, 429: 421}


def problem(http_status: int, detail: str, smqp_code: int, **extra) -> Response:
    body = {"type": "about:blank", "title": HTTPStatus(http_status).phrase,
            "status": http_status, "detail": detail, "smqp_code": smqp_code, **extra}
    return Response(body, status=http_status, content_type=PROBLEM)


def from_service(exc: ServiceError | ProtocolError) -> Response:
    # A selector refusal (567) says where in its text: as a field too, for programs.
    column = getattr(exc, "column", None)
    extra = {"column": column} if isinstance(column, int) else {}
    return problem(HTTP_STATUS.get(exc.code, 400), exc.text, exc.code, **extra)


def handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, ServiceError | ProtocolError):
        return from_service(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = response.status_code
    data = response.data
    extra = {}
    if isinstance(exc, exceptions.ValidationError):
        detail = "The request is not valid."
        extra["errors"] = data
    elif isinstance(data, dict) and "detail" in data:
        detail = str(data["detail"])
    else:
        detail = HTTPStatus(code).phrase
    out = problem(code, detail, SMQP_CODE.get(code, 400), **extra)
    for name in ("WWW-Authenticate", "Retry-After", "Allow"):
        if name in response:
            out[name] = response[name]
    return out


def not_found(what: str = "") -> Response:
    return problem(status.HTTP_404_NOT_FOUND, f"Not found ({what})" if what else "Not found",
                   404)
