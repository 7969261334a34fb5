"""What the API views share: request validation, cursor errors and the documented error
responses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.http import QueryDict
from drf_spectacular.utils import OpenApiResponse
from rest_framework.exceptions import ValidationError
from rest_framework.serializers import Serializer

from chat.api import serializers as s
from chat.api.errors import ApiError
from chat.cursors import InvalidCursor

_ERRORS = {
    400: OpenApiResponse(s.ErrorSerializer, description="Invalid input."),
    403: OpenApiResponse(s.ErrorSerializer, description="Not authenticated."),
    404: OpenApiResponse(s.ErrorSerializer, description="Not found (or not yours)."),
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: _ERRORS[code] for code in codes}


def valid(serializer_class: type[Serializer], data: Any) -> dict[str, Any]:
    """The validated data, or DRF's ValidationError (a 400 in the error shape). A query
    parameter given twice (`?limit=1&limit=2`) is refused, as a body's key given twice is:
    which one counts would be a guess."""
    if isinstance(data, QueryDict):
        query_once_each(data)
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def query_once_each(query: QueryDict) -> None:
    """ValidationError (400 invalid) when a query parameter is given more than once."""
    repeated = sorted(key for key, values in query.lists() if len(values) > 1)
    if repeated:
        raise ValidationError({key: ["Given more than once."] for key in repeated})


@contextmanager
def cursor_errors() -> Iterator[None]:
    try:
        yield
    except InvalidCursor as exc:
        raise ApiError(str(exc), code="invalid_cursor") from exc
