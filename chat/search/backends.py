"""The two halves of a message search, as SQL for each database.

A search walks the scope's messages newest first and finds every one whose content contains the
query (case-insensitive substring). Two strategies, because neither alone is fast at every
frequency of the searched text:

- **Window scan**: the newest `window` messages of the scope (below the paging position), read in
  id order and tested one by one. Cheap and bounded whatever the session's size, and a term that
  is common fills the page here, before the index is asked (an index returns *every* match and
  sorts them: tens of thousands of rows for "Django" in a million-message session).
- **Index**: below the window, the trigram index (PostgreSQL pg_trgm GIN, SQLite FTS5 trigram)
  finds the matches of a rarer term without reading the rows that do not contain it. A term that
  did not fill the page inside the window is, by construction, not dense below it either.

Queries shorter than three characters (two-character Chinese words among them) have no trigram
to look up, so they only ever use the window scan, one window per request; the page's cursor
continues the walk (docs/search.md).

Everything here is raw SQL over `chat_messages` on purpose: Django's `icontains` on PostgreSQL is
`UPPER(content) LIKE UPPER(...)`, which the trigram index on `content` cannot serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

# Trigrams: the indexes cannot look up anything shorter.
MIN_INDEXED_QUERY = 3


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose messages a search may return. `owner_id` None is every user's (the Django admin
    only); `session_id` narrows to one session; `below_id` is the paging position (only ids
    under it); `role` None is every role but `system`."""

    owner_id: int | None
    session_id: int | None = None
    role: str | None = None
    below_id: int | None = None


@dataclass(frozen=True, slots=True)
class Window:
    lowest_id: int  # the oldest message the window holds
    rows: int  # how many it holds; fewer than asked means the scope ends inside it


def _scope_sql(scope: Scope) -> tuple[str, list[Any]]:
    """The WHERE clauses of a scope. Every clause is a fixed string of this module and every
    value a bound parameter: nothing a user typed is ever part of the SQL text."""
    # Replies still streaming are not indexed (chat/migrations/0006); the scan leaves them out
    # too so both halves agree. The literal predicate also lets PostgreSQL use the partial index.
    clauses = ["m.status <> 'streaming'"]
    params: list[Any] = []
    if scope.session_id is not None:
        clauses.append("m.session_id = %s")
        params.append(scope.session_id)
    elif scope.owner_id is not None:
        clauses.append("m.session_id IN (SELECT s.id FROM chat_sessions s WHERE s.owner_id = %s)")
        params.append(scope.owner_id)
    if scope.role is not None:
        clauses.append("m.role = %s")
        params.append(scope.role)
    else:
        clauses.append("m.role <> 'system'")
    if scope.below_id is not None:
        clauses.append("m.id < %s")
        params.append(scope.below_id)
    return " AND ".join(clauses), params


def _fetch(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def window_bounds(*, scope: Scope, rows: int) -> Window | None:
    """The newest `rows` messages of the scope: where they end, and how many there are. None
    for an empty scope. An index-ordered walk of ids only (chat_msg_session_id_idx for one
    session, the primary key otherwise)."""
    where, params = _scope_sql(scope)
    found = _fetch(
        "SELECT MIN(w.id), COUNT(*) FROM (SELECT m.id FROM chat_messages m "  # noqa: S608
        f"WHERE {where} ORDER BY m.id DESC LIMIT %s) w",
        [*params, rows],
    )
    lowest, count = found[0] if found else (None, 0)
    if lowest is None:
        return None
    return Window(lowest_id=int(lowest), rows=int(count))


def window_hits(*, scope: Scope, query: str, lowest_id: int, limit: int) -> list[int]:
    """Ids of the window's messages (id >= lowest_id) that contain `query`, newest first."""
    where, params = _scope_sql(scope)
    contains, contains_params = _contains_sql(query)
    rows = _fetch(
        f"SELECT m.id FROM chat_messages m WHERE {where} AND m.id >= %s AND {contains} "  # noqa: S608
        "ORDER BY m.id DESC LIMIT %s",
        [*params, lowest_id, *contains_params, limit],
    )
    return [int(r[0]) for r in rows]


def index_hits(*, scope: Scope, query: str, limit: int) -> list[int]:
    """Ids of the scope's messages that contain `query` (3+ characters), newest first, found
    through the trigram index."""
    if len(query) < MIN_INDEXED_QUERY:
        raise ValueError("the trigram index cannot look up fewer than 3 characters")
    where, params = _scope_sql(scope)
    if connection.vendor == "sqlite":
        # CROSS JOIN makes the FTS table the outer loop (SQLite keeps the order as written):
        # it walks the matches newest first and stops at `limit`, where the other order would
        # visit every message of the session. rowid is the message id.
        # The paging bound on the FTS side as well, so FTS5 starts its walk there.
        below = "" if scope.below_id is None else "AND f.rowid < %s "
        rows = _fetch(
            "SELECT f.rowid FROM chat_message_fts f CROSS JOIN chat_messages m "  # noqa: S608
            f"ON m.id = f.rowid WHERE chat_message_fts MATCH %s {below}AND {where} "
            "ORDER BY f.rowid DESC LIMIT %s",
            [
                _fts_phrase(query),
                *([] if scope.below_id is None else [scope.below_id]),
                *params,
                limit,
            ],
        )
    else:
        contains, contains_params = _contains_sql(query)
        rows = _fetch(
            f"SELECT m.id FROM chat_messages m WHERE {where} AND {contains} "  # noqa: S608
            "ORDER BY m.id DESC LIMIT %s",
            [*params, *contains_params, limit],
        )
    return [int(r[0]) for r in rows]


def _contains_sql(query: str) -> tuple[str, list[Any]]:
    if connection.vendor == "postgresql":
        # ILIKE, not UPPER() LIKE: pg_trgm's GIN operator class serves ILIKE on the column.
        return "m.content ILIKE %s ESCAPE '\\'", [f"%{_like_escape(query)}%"]
    # instr() has no wildcards to escape. lower() folds ASCII only, as SQLite's LIKE does.
    return "instr(lower(m.content), lower(%s)) > 0", [query]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _fts_phrase(query: str) -> str:
    # One FTS5 string token: every character literal, quotes doubled. With the trigram
    # tokenizer a phrase is a substring match, case-folded.
    return '"' + query.replace('"', '""') + '"'
