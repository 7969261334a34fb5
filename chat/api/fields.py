"""Request fields that take a value only in the type it is documented in.

DRF's own fields convert: CharField stores the number 12 as "12", IntegerField reads "1.0",
" 1", "١٢" (Arabic-Indic digits) and "１２" (full-width) as integers. A client that sends the
wrong type has a bug, and a guess made for it stores text nobody typed (and calls the model
with it) or sends a message to a session whose id the request does not show. These fields
refuse instead, with the same 400 `invalid` as any other bad field. Ids follow the rule the
path ids and the agent routes follow (chat.text.ascii_int)."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from rest_framework import serializers

from chat.text import ascii_int, line_problem

MAX_DB_ID = 2**63 - 1


class EmptyIsGiven:
    """A query parameter given empty (`?before=`) is a value, to be judged as one, not read
    as absent as DRF reads it (docs/api.md): `?session_id=` of a search searched every
    session, `?before=` read the newest page."""

    field_name: str | None

    def get_value(self, dictionary: Any) -> Any:
        if isinstance(dictionary, QueryDict) and dictionary.get(self.field_name or "") == "":
            return ""
        return super().get_value(dictionary)  # type: ignore[misc]


class StrictCharField(EmptyIsGiven, serializers.CharField):
    """A JSON string, never a number or a boolean made into one."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class CursorField(StrictCharField):
    """A page's cursor, as the server wrote it: not trimmed (" <cursor>" is not a cursor)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, **kwargs)


class LineField(StrictCharField):
    """A one-line name: a JSON string without line breaks or other control characters."""

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        problem = line_problem(value)
        if problem:
            raise serializers.ValidationError(f"This field {problem}.")
        return value


class StrictChoiceField(EmptyIsGiven, serializers.ChoiceField):
    """One of its choices; `?render=` is none of them."""


class StrictDateField(EmptyIsGiven, serializers.DateField):
    """A date; `?date=` is not one."""


class StrictIntegerField(EmptyIsGiven, serializers.IntegerField):
    """A JSON integer in a body; in a query string, ASCII digits. Not 1.0, "1.0", " 1" or "١",
    nor "3" in a body (docs/api.md: an id there is a JSON integer), nor `?limit=`."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and not _in_query_string(self):
            self.fail("invalid")
        parsed = ascii_int(data)
        if parsed is None:
            self.fail("invalid")
        return parsed


def _in_query_string(field: serializers.Field) -> bool:
    """Whether `field` reads a query string (text only) rather than a JSON body (typed)."""
    return isinstance(getattr(field.root, "initial_data", None), QueryDict)


def id_field(**kwargs: Any) -> StrictIntegerField:
    """A database id: a positive integer that fits the column."""
    return StrictIntegerField(min_value=1, max_value=MAX_DB_ID, **kwargs)


class BodySerializer(serializers.Serializer):
    """A JSON body's fields: one it does not name is refused (400 `invalid`), not ignored. A
    misspelt `{"titel": ...}` made an untitled session, and `session_id` in a socket's send
    frame went, unread, to the socket's own session."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {"non_field_errors": [f"unknown field(s): {', '.join(unknown)}"]}
                )
        return super().to_internal_value(data)
