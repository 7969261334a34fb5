"""Error pages: the API's JSON error shape under /api/, Django's HTML pages elsewhere. A route
the URLconf does not know, or a crash, must not answer an API client with HTML."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from chat.api.errors import error_body

API_PREFIX = "/api/"


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        body = error_body("server_error", "Something went wrong on the server; it was logged.")
        return JsonResponse(body, status=500)
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse(error_body("bad_request", "Bad request."), status=400)
    return defaults.bad_request(request, exception)  # type: ignore[arg-type]
