"""Query helpers for reading one session's messages in id order, planned the way the
(session_id, id) indexes intend. The lowest layer above the models: the context engine, the
selectors and the turn service all page through messages with these."""

from __future__ import annotations

from typing import Literal

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
