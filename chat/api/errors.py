"""Every API error has one shape: `{"error": {"code": ..., "message": ..., "details"?: ...}}`.

The services' domain errors (chat/errors.py) are translated here, the one place that knows
which HTTP status each deserves; views raise ApiError for what only they check (a cursor)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404
from redis import exceptions as redis_exceptions
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from chat.errors import (
    ChatError,
    CompactionFailed,
    CompactionInProgress,
    ReplyInProgress,
    SearchTimeout,
    Throttled,
    TooManyReplies,
)

logger = logging.getLogger("chat.api")

# Domain errors that are not a plain 400. (NotFound is also Django's Http404: 404 below.)
_STATUS: dict[type[ChatError], int] = {
    ReplyInProgress: status.HTTP_409_CONFLICT,
    CompactionInProgress: status.HTTP_409_CONFLICT,
    CompactionFailed: status.HTTP_502_BAD_GATEWAY,
    TooManyReplies: status.HTTP_429_TOO_MANY_REQUESTS,
    Throttled: status.HTTP_429_TOO_MANY_REQUESTS,
    SearchTimeout: status.HTTP_503_SERVICE_UNAVAILABLE,
}


class ApiError(exceptions.APIException):
    """Raise from views with a stable machine-readable code."""

    status_code: int = status.HTTP_400_BAD_REQUEST
    default_code = "bad_request"

    def __init__(self, message: str, *, code: str = "bad_request", status_code: int = 400) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            label = key if key != "non_field_errors" else ""
            out.extend(_flatten(value, f"{prefix}{label}: " if label else prefix))
        return out
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, prefix)]
    return [f"{prefix}{detail}"]


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return {"error": body}


def _status_of(exc: ChatError) -> int:
    for kind, code in _STATUS.items():
        if isinstance(exc, kind):
            return code
    return status.HTTP_400_BAD_REQUEST


# A dependency that does not answer (PostgreSQL restarting, Redis down): the request may be
# tried again in a moment, which a 500 does not say.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    redis_exceptions.ConnectionError,
    redis_exceptions.TimeoutError,
)
UNAVAILABLE_RETRY_SECONDS = 5


def _unavailable(exc: Exception) -> Response:
    logger.warning("api_dependency_unavailable error=%r", exc, exc_info=True)
    response = Response(
        error_body(
            "service_unavailable",
            "The server cannot reach its database or cache just now; try again shortly.",
        ),
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_SECONDS)
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return _unavailable(exc)
    retry_after = exc.retry_after if isinstance(exc, ChatError) else None
    if isinstance(exc, ChatError) and not isinstance(exc, Http404):
        exc = ApiError(exc.message, code=exc.code, status_code=_status_of(exc))
    if isinstance(exc, Http404):
        # Never say whether the object exists for someone else: one message for both.
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        code, message, details = exc.error_code, str(exc.detail), None
    elif isinstance(exc, exceptions.ValidationError):
        code = "invalid"
        message = "; ".join(_flatten(exc.detail)) or "Invalid input."
        details = exc.detail
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        message = str(exc.detail)
        details = None
    else:  # pragma: no cover - drf only handles APIException subclasses
        code, message, details = "error", str(exc), None
    response.data = error_body(code, message, details)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
