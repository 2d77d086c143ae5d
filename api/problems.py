"""RFC 9457 problem details for every refusal, with ``smqp_code``: the SMQP reply code the
same refusal gets on the wire. Services refuse with :class:`broker.services.ServiceError`,
which carries a :class:`~broker.domain.errors.Refusal`: its ``http``, ``title`` and
``problem_type`` are what this door answers (:func:`from_service`, the one place)."""

from __future__ import annotations

import logging
from http import HTTPStatus

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from broker.domain.errors import ProtocolError, Refusal
from broker.services import ServiceError

logger = logging.getLogger("api")

PROBLEM = "application/problem+json"

#: HTTP status of DRF's own refusals → the SMQP code of the nearest SMQP refusal.
SMQP_CODE = {400: 400, 401: 530, 403: 401, 404: 404, 405: 400, 406: 400, 409: 409, 413: 414,
             415: 400, 422: 400, 429: 421}


def problem(http_status: int, detail: str, smqp_code: int, *, title: str | None = None,
            problem_type: str = "about:blank", **extra) -> Response:
    body = {"type": problem_type, "title": title or HTTPStatus(http_status).phrase,
            "status": http_status, "detail": detail, "smqp_code": smqp_code, **extra}
    return Response(body, status=http_status, content_type=PROBLEM)


def from_service(exc: ServiceError | ProtocolError) -> Response:
    """The problem for a refusal of the services or of a value's syntax."""
    try:
        refusal = exc.refusal
    except ValueError:  # a ProtocolError with a code no refusal has: a bad request
        refusal = Refusal.BAD_REQUEST
    # A selector refusal (567) says where in its text: as a field too, for programs.
    column = getattr(exc, "column", None)
    extra = {"column": column} if isinstance(column, int) else {}
    return problem(refusal.http, exc.text, exc.code, title=refusal.title,
                   problem_type=refusal.problem_type, **extra)


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
