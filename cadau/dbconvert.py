"""Values of a raw statement's row converted as the ORM's compiler converts them, for the reads
written once as SQL on a send's way to its first token (cadau/tokens.py, chat/queries.py).

Col and get_db_converters are Django internals: tests/test_tokens.py and
tests/chat/test_queries.py hold each read's result to the ORM's own, on SQLite and PostgreSQL,
so a change in Django shows there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import Field, Model
from django.db.models.expressions import Col

Converter = Callable[[Any, Any, Any], Any]


def field_converters(
    connection: Any, model: type[Model], field: Field[Any, Any]
) -> tuple[Col, list[Converter]]:
    """The database's converters, then the field's, for `model`'s column of `field`: what the
    ORM's compiler applies to it (SQLite gives dates as text, booleans as integers)."""
    col = Col(model._meta.db_table, field)
    return col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]


def value_converted(value: Any, col: Col, converters: list[Converter], connection: Any) -> Any:
    for convert in converters:
        value = convert(value, col, connection)
    return value
