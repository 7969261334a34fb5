"""Query helpers for reading one session's messages in id order, planned the way the
(session_id, id) indexes intend. The lowest layer above the models: the context engine, the
selectors and the turn service all page through messages with these."""

from __future__ import annotations

import json
from typing import Any, Literal

from django.db import connection
from django.db.models import QuerySet

from chat.models import ChatMessage


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
