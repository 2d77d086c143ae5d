"""The OpenAPI schema: every operation documents its refusals (problem details, any
status) as the ``default`` response, so a client and the schema fuzzer know their form."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema

from .problems import PROBLEM


class ProblemAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction: str = "response") -> dict:
        responses = super()._get_response_bodies(direction)
        from .serializers import ProblemSerializer

        responses["default"] = {
            "content": {PROBLEM: {"schema": self.resolve_serializer(
                ProblemSerializer, "response").ref}},
            "description": "A refusal: RFC 9457 problem details with smqp_code.",
        }
        return responses


class BearerScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.BearerAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema) -> dict:
        return {"type": "http", "scheme": "bearer",
                "description": "smqp_... (POST /api/v1/auth/tokens, manage.py token, or the "
                               "admin)"}
