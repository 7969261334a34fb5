"""The OpenAPI schema (/api/schema/) and its Swagger UI (/api/docs/), for logged-in users.

Logged-in users (session or token) only, unless API_DOCS_PUBLIC: the schema names every route,
parameter and limit of the instance, a map for someone probing it and of no use to anyone who
cannot log in. An anonymous request gets the API's usual 403 `not_authenticated`, in JSON
whatever format the schema was asked in."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response


class ApiDocsPermission(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if settings.API_DOCS_PUBLIC:
            return True
        user = request.user
        return bool(user and user.is_authenticated)


def _json_errors(request: Request) -> None:
    """Errors in the API's JSON shape: the negotiated renderer is YAML or HTML here."""
    request.accepted_renderer = JSONRenderer()
    request.accepted_media_type = "application/json"


class SchemaView(SpectacularAPIView):
    permission_classes = [ApiDocsPermission]

    def handle_exception(self, exc: Exception) -> Response:
        _json_errors(self.request)
        return super().handle_exception(exc)


class SwaggerView(SpectacularSwaggerView):
    permission_classes = [ApiDocsPermission]

    def handle_exception(self, exc: Exception) -> Response:
        _json_errors(self.request)
        return super().handle_exception(exc)
