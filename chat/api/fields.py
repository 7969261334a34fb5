"""Request fields that take a value only in the type it is documented in.

DRF's own fields convert: CharField stores the number 12 as "12", IntegerField reads "1.0",
" 1", "١٢" (Arabic-Indic digits) and "１２" (full-width) as integers. A client that sends the
wrong type has a bug, and a guess made for it stores text nobody typed (and calls the model
with it) or sends a message to a session whose id the request does not show. These fields
refuse instead, with the same 400 `invalid` as any other bad field. Ids follow the rule the
path ids and the agent routes follow (chat.text.ascii_int)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from chat.text import ascii_int

MAX_DB_ID = 2**63 - 1


class StrictCharField(serializers.CharField):
    """A JSON string, never a number or a boolean made into one."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, or (in a query string) ASCII digits; not 1.0, "1.0", " 1" or "١"."""

    def to_internal_value(self, data: Any) -> int:
        parsed = ascii_int(data)
        if parsed is None:
            self.fail("invalid")
        return parsed


def id_field(**kwargs: Any) -> StrictIntegerField:
    """A database id: a positive integer that fits the column."""
    return StrictIntegerField(min_value=1, max_value=MAX_DB_ID, **kwargs)
