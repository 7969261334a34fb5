"""Query helpers for reading one session's messages in id order, planned the way the
(session_id, id) indexes intend, and the session itself as every route taking its id reads it.
The lowest layer above the models: the context engine, the selectors and the turn service all
read through these."""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.contrib.auth import get_user_model
from django.db import connection, connections, router
from django.db.models import Model, QuerySet
from django.db.models.expressions import Col

from cadau.dbconvert import field_converters, value_converted
from chat.models import Agent, ChatMessage, ChatSession


def message_rows(
    qs: QuerySet[ChatMessage], *, order: Literal["id", "-id"], limit: int
) -> QuerySet[ChatMessage]:
    """`qs.order_by(order)[:limit]` for a filter on one session.

    Asked for `WHERE session_id = X ORDER BY id DESC LIMIT n`, PostgreSQL may walk the primary
    key and filter on session_id, reading every newer row of every other session first (675 ms
    for a 100k session beneath a 1M one; docs/benchmarks.md). Choosing the ids in a subquery
    makes that an index(-only) scan of the session's own index, and the outer query fetches n
    rows by primary key. Still one statement; SQLite plans both forms the same."""
    ids = qs.order_by(order).values("id")[:limit]
    return ChatMessage.objects.filter(id__in=ids).order_by(order)


def message_exists(qs: QuerySet[ChatMessage]) -> bool:
    """`qs.exists()` for a session filter, immune to the same primary-key walk (which, when the
    answer is no, reads the whole table)."""
    return message_rows(qs, order="id", limit=1).exists()


# The columns message_tail_rows returns, in order; then created_at as the database gives it
# (see message_tail_rows).
TAIL_COLUMNS = ("id", "role", "content", "tool_calls", "tool_call_id", "status")


def message_tail_rows(
    *,
    session_id: int,
    order: Literal["id", "-id"],
    limit: int,
    from_id: int | None = None,
    below_id: int | None = None,
) -> list[tuple[Any, ...]]:
    """Up to `limit` of the session's messages with `from_id <= id < below_id` (either bound
    optional), in `order`, as TAIL_COLUMNS tuples with tool_calls decoded and the row's
    created_at last, undecoded on SQLite (text: most rows' dates are never looked at, and
    Django's converter parsing each took more than the read; chat.search.backends'
    stamp_datetime reads either): message_rows' plan (the ids chosen from
    chat_msg_session_id_idx in a subquery), written out.
    Raw SQL because this is the read before every send's first token, and for a page of 200
    rows the ORM took longer to build the statement and convert its rows than PostgreSQL
    took to answer it (1.4 ms against 0.6 ms; bench ttft).
    No status condition: the subquery must be answerable from chat_msg_session_id_idx alone
    (a status filter sends PostgreSQL back to walking the primary key); callers skip the few
    streaming or failed rows themselves."""
    table = connection.ops.quote_name(ChatMessage._meta.db_table)
    conditions, params = ["session_id = %s"], [session_id]
    if from_id is not None:
        conditions.append("id >= %s")
        params.append(from_id)
    if below_id is not None:
        conditions.append("id < %s")
        params.append(below_id)
    direction = "DESC" if order == "-id" else "ASC"
    # SQLite: an expression (a unary plus, a no-op) has no declared type, so the driver leaves
    # the text as it is.
    created_at = "+created_at" if connection.vendor == "sqlite" else "created_at"
    # Only constants (columns, the table, the direction) are formatted in; values are bound.
    sql = (
        f"SELECT {', '.join(TAIL_COLUMNS)}, {created_at} "  # noqa: S608
        f"FROM {table} WHERE id IN ("
        f"SELECT id FROM {table} WHERE {' AND '.join(conditions)} "
        f"ORDER BY id {direction} LIMIT %s) ORDER BY id {direction}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit])
        rows = cursor.fetchall()
    # JSON arrives as text on both databases (Django's psycopg setup leaves jsonb undecoded).
    return [
        (mid, role, content, json.loads(calls) if isinstance(calls, str) else calls, tcid, st, at)
        for mid, role, content, calls, tcid, st, at in rows
    ]


# --- a session with its owner and agent, for every route that takes a session id --------------


def session_owned_row(*, session_id: int, owner_id: int) -> ChatSession | None:
    """The session `session_id` if `owner_id` owns it and is active, with its owner and agent
    loaded: what `ChatSession.objects.select_related("agent", "owner").get(...)` returns, in a
    statement whose SQL is written once per database. The ORM compiled that query again on
    every send (~0.5 ms of the ~0.8 the read took before the first token, bench ttft); the
    database answers in ~0.07. tests/chat/test_queries.py holds the result to the ORM's."""
    db = router.db_for_read(ChatSession)
    connection = connections[db]
    sql, parts = _session_owned_sql(db)
    with connection.cursor() as cursor:
        cursor.execute(sql, [session_id, owner_id])
        row = cursor.fetchone()
    if row is None:
        return None
    session, owner, agent = (_instance(connection, db, row, part) for part in parts)
    session.owner = owner
    # The LEFT JOIN gives an agent of NULLs where the session has none.
    session.agent = agent if session.agent_id is not None else None
    return session


def _pk(model: type[Model], quote: Any) -> str:
    pk = model._meta.pk
    assert pk is not None  # every concrete model has one
    return str(quote(pk.column))


@dataclass(frozen=True, slots=True)
class _Part:
    """One model's columns in the row: where they start, and their fields."""

    model: type[Model]
    start: int
    fields: tuple[Any, ...]
    attnames: tuple[str, ...]


def _instance(connection: Any, db: str, row: Sequence[Any], part: _Part) -> Any:
    """`part`'s model instance from the row as the database gave it (SQLite: text dates and
    integer booleans; JSON as text), converted as the ORM's compiler converts it."""
    values = [
        value_converted(value, col, found, connection)
        for value, (col, found) in zip(
            row[part.start :], _converters(connection, part), strict=False
        )
    ]
    return part.model.from_db(db, list(part.attnames), values)


# Each connection's converters of each part: bound to that connection (a thread's own), and
# asked of Django once per connection, not on every read (~0.2 ms a read).
_converters_kept: weakref.WeakKeyDictionary[Any, dict[_Part, Any]] = weakref.WeakKeyDictionary()


def _converters(connection: Any, part: _Part) -> list[tuple[Col, list[Any]]]:
    """Each of `part`'s columns with its converters (cadau/dbconvert.py)."""
    kept = _converters_kept.setdefault(connection, {})
    found = kept.get(part)
    if found is None:
        found = [field_converters(connection, part.model, field) for field in part.fields]
        kept[part] = found
    return found


@functools.cache
def _session_owned_sql(db: str) -> tuple[str, tuple[_Part, ...]]:
    """The statement, and where the session's, its owner's and its agent's columns lie in its
    row."""
    quote = connections[db].ops.quote_name
    user_model = get_user_model()
    parts: list[_Part] = []
    selected: list[str] = []
    for model, alias in ((ChatSession, "s"), (user_model, "u"), (Agent, "a")):
        fields = tuple(model._meta.concrete_fields)
        parts.append(_Part(model, len(selected), fields, tuple(f.attname for f in fields)))
        selected += [f"{alias}.{quote(f.column)}" for f in fields]
    sessions, users, agents = (quote(m._meta.db_table) for m in (ChatSession, user_model, Agent))
    owner_fk = quote(ChatSession.owner.field.column)
    agent_fk = quote(ChatSession.agent.field.column)
    active = quote(user_model._meta.get_field("is_active").column)
    # Only names from the models' meta are formatted in; the ids are bound.
    sql = (
        f"SELECT {', '.join(selected)} FROM {sessions} s"  # noqa: S608
        f" INNER JOIN {users} u ON u.{_pk(user_model, quote)} = s.{owner_fk}"
        f" LEFT OUTER JOIN {agents} a ON a.{_pk(Agent, quote)} = s.{agent_fk}"
        f" WHERE s.{_pk(ChatSession, quote)} = %s AND s.{owner_fk} = %s AND u.{active}"
    )
    return sql, tuple(parts)


# --- a send's two rows ------------------------------------------------------------------------


def message_insert(message: ChatMessage) -> ChatMessage:
    """INSERT the unsaved `message` as `message.save()` would (each field's pre_save: defaults,
    auto_now; its database value: JSON), in SQL written once per database, and mark it saved.
    A send stores two rows before its first token, and the ORM compiled each INSERT anew
    (~0.35 ms of Python apiece, bench ttft). No model signals: none are connected to
    ChatMessage (tests/chat/test_queries.py checks both)."""
    db = router.db_for_write(ChatMessage)
    connection = connections[db]
    if not connection.features.can_return_columns_from_insert:
        message.save(force_insert=True, using=db)
        return message
    sql, fields = _message_insert_sql(db)
    values = [f.get_db_prep_save(f.pre_save(message, True), connection=connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    message.pk = row[0]
    message._state.adding, message._state.db = False, db
    return message


@functools.cache
def _message_insert_sql(db: str) -> tuple[str, list[Any]]:
    quote = connections[db].ops.quote_name
    fields = [f for f in ChatMessage._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(quote(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    # Only names from the model's meta are formatted in; the values are bound.
    sql = (
        f"INSERT INTO {quote(ChatMessage._meta.db_table)} ({columns}) "  # noqa: S608
        f"VALUES ({marks}) RETURNING {_pk(ChatMessage, quote)}"
    )
    return sql, fields
