"""Cursor paging: every list that can grow comes in pages of ``limit`` items (at most
``SMQP_API_PAGE_MAX``) with an opaque ``next`` link; a page never costs more than that.
The cursor is the sort key of the last item sent (a list sorted by a unique key needs no
offset, and items added or removed meanwhile do not shift the pages)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param


class PageQuery(serializers.Serializer):
    cursor = serializers.CharField(required=False, max_length=2000,
                                   help_text="The `next` link's cursor.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000,
                                     help_text="Items per page.")


def encode(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode(cursor: str) -> Any:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise ValidationError({"cursor": ["Invalid cursor."]}) from exc


def params(request: Request, kind: type | tuple[type, ...]) -> tuple[Any, int]:
    """(the cursor's key or None, the page size) of a list request."""
    query = PageQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    limit = min(query.validated_data.get("limit") or settings.SMQP_API_PAGE_SIZE,
                settings.SMQP_API_PAGE_MAX)
    cursor = query.validated_data.get("cursor")
    after = None
    if cursor:
        after = decode(cursor)
        # Only what a `next` link can hold: a row id in the database's range, or a key
        # without NUL (neither database takes one in a string).
        if not isinstance(after, kind) or isinstance(after, bool) or (
                isinstance(after, int) and not 0 <= after <= 2**62) or (
                isinstance(after, str) and (len(after) > 1024 or "\x00" in after)):
            raise ValidationError({"cursor": ["Invalid cursor."]})
    return after, limit


def page(request: Request, results: list, next_key: Any | None) -> Response:
    link = None
    if next_key is not None:
        link = replace_query_param(request.build_absolute_uri(), "cursor", encode(next_key))
    return Response({"next": link, "results": results})


def page_of(request: Request, rows: QuerySet, limit: int, data: Callable[[Any], Any],
            key: Callable[[Any], Any]) -> Response:
    """The page of ``rows`` (already filtered past the cursor, in cursor order): up to
    ``limit`` items as ``data(item)``, and a ``next`` link to the cursor ``key(last item)``
    when there are more (read as one row beyond the page)."""
    items = list(rows[:limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return page(request, [data(x) for x in items], key(items[-1]) if more else None)


_classes: dict[str, type[serializers.Serializer]] = {}


def paged(item: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """The schema of a page of ``item``s (one class per item type)."""
    name = "Paged" + item.__name__.removesuffix("Serializer")
    if name not in _classes:
        _classes[name] = type(name, (serializers.Serializer,), {
            "next": serializers.URLField(allow_null=True),
            "results": item(many=True),
        })
    return _classes[name]
