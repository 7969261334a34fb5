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

Queries without three letters or digits in a row (two-character Chinese words, "C#", "---")
have no trigram to look up, so they only ever use the window scan, one window per request; the
page's cursor continues the walk (docs/search.md).

Everything here is raw SQL over `chat_messages` on purpose: Django's `icontains` on PostgreSQL is
`UPPER(content) LIKE UPPER(...)`, which the trigram index on `content` cannot serve.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from time import monotonic
from typing import Any, cast

import psycopg
from django.db import connection
from psycopg.types.datetime import TimestamptzLoader

from chat.errors import SearchTimeout

# Pages of FTS5 merge work per tidy: a reply adds a segment or two of a page or two, so this
# keeps up with the sends while one tidy stays well under a millisecond or two.
MERGE_PAGES = 32

# pg_trgm takes its trigrams from runs of letters and digits only: "---" or "a-b" give it
# nothing to look up, and the "index" search would read every row of the table.
_TRIGRAM_RUN = re.compile(r"[^\W_]{3}")
# When the search running on this thread must stop (time.monotonic()), set by
# selectors.search_deadline; every statement here gets only what is left of it.
DEADLINE: ContextVar[float | None] = ContextVar("search_deadline", default=None)
TIMEOUT_MESSAGE = "The search took too long. Search one chat, or use more characters."
# PostgreSQL: the statement_timeout (seconds) in force in this search's transaction. A statement
# may start without setting it again while that cannot overrun the deadline by more than
# TIMEOUT_SLACK: a search of a few quick statements then costs no extra round trips.
PG_TIMEOUT: ContextVar[float | None] = ContextVar("search_pg_timeout", default=None)
TIMEOUT_SLACK = 0.25
# PostgreSQL: the search began outside any transaction, and every statement carries its own
# limit in its message (selectors._postgres_deadline); PG_TIMEOUT is not used then.
PG_PER_STATEMENT: ContextVar[bool] = ContextVar("search_pg_per_statement", default=False)


def indexable(query: str) -> bool:
    """Whether the trigram index can find `query`: three letters or digits in a row."""
    return _TRIGRAM_RUN.search(query) is not None


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose messages a search may return. `owner_id` None is every user's (the Django admin
    only); `session_id` narrows to one session (of that owner: both are in the SQL, so a caller
    that forgot the ownership check still finds nothing of another user's); `below_id` is the
    paging position (only ids under it); `role` None is every role but `system`;
    `recallable`: only what automatic recall may bring back (user and assistant messages the
    model is sent; not tool results, nor failed replies)."""

    owner_id: int | None
    session_id: int | None = None
    role: str | None = None
    below_id: int | None = None
    recallable: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    lowest_id: int  # the oldest message the window holds
    highest_id: int  # and the newest
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
    if scope.owner_id is not None:
        # The owner's id copied onto each message (chat/migrations/0007), on chat_msg_owner_id_idx:
        # `session_id IN (their sessions)` walked every other user's newer messages.
        clauses.append("m.owner_id = %s")
        params.append(scope.owner_id)
    if scope.role is not None:
        clauses.append("m.role = %s")
        params.append(scope.role)
    else:
        clauses.append("m.role <> 'system'")
    if scope.recallable:
        # Inside the statement, not after it: an agent's fetched pages match a term far more
        # often than what was said, and would fill a lookup's LIMIT with rows recall drops.
        clauses.append("m.role IN ('user', 'assistant') AND m.status <> 'failed'")
    if scope.below_id is not None:
        clauses.append("m.id < %s")
        params.append(scope.below_id)
    return " AND ".join(clauses), params


def pg_client_binding() -> bool:
    """Whether this PostgreSQL connection's cursors bind parameters on the client (Django's
    default): then one execute may carry several statements."""
    connection.ensure_connection()
    factory = getattr(connection.connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, psycopg.ClientCursor)


def bounded_rows(sql: str, params: list[Any], *, timestamps: bool = False) -> list[tuple[Any, ...]]:
    """The statement's rows, within the search's deadline. `timestamps`: it reads created_at."""
    deadline = DEADLINE.get()
    limit = ""
    with connection.cursor() as cursor:
        if deadline is not None:
            left = deadline - monotonic()
            if left <= 0:
                raise SearchTimeout(TIMEOUT_MESSAGE)
            per_statement = PG_PER_STATEMENT.get()
            in_force = None if per_statement else PG_TIMEOUT.get()
            if connection.vendor == "postgresql" and (
                in_force is None or in_force - left > TIMEOUT_SLACK
            ):
                # statement_timeout bounds one statement: each gets what is left of the search's
                # time, so a search of several statements stays within it as a whole. A literal:
                # SET takes no bind parameters (an int, nothing to quote).
                limit = f"SET LOCAL statement_timeout = {max(1, int(left * 1000))}"
                if not per_statement:
                    # In the search's savepoint: it lasts to the transaction's end.
                    PG_TIMEOUT.set(left)
                    if not pg_client_binding():
                        cursor.execute(limit)
                        limit = ""
        if timestamps and connection.vendor == "postgresql":
            # psycopg's own timestamptz loader (C) for this cursor, not the one Django sets on
            # the connection (a Python subclass that replaces each value's tzinfo): recall's
            # first read of a window, 1,000 rows, 5.6 -> 2.4 ms, of which created_at was 3.4 ms
            # (bench ttft's data). Its values are aware, in the session's time zone (UTC as
            # Django sets it; stamp_datetime makes sure). The cursor's copy of the adapters only.
            cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        if limit:
            # In the statement's own message: outside a transaction the two are one implicit
            # transaction, so the limit holds for the statement and ends with it; inside one it
            # lasts to its end, as above. One round trip, not two.
            cursor.execute(f"{limit}; {sql}", params)
            cursor.cursor.nextset()  # past the SET's empty result, to the statement's rows
        else:
            cursor.execute(sql, params)
        return list(cursor.fetchall())


def window_bounds(*, scope: Scope, rows: int) -> Window | None:
    """The newest `rows` messages of the scope: where they end, and how many there are. None
    for an empty scope.

    Ids only, selected by the scope's key alone (the session, else the owner) and the paging
    position: an index-only walk of chat_msg_session_id_idx or chat_msg_owner_id_idx. With the
    status and role filters in this query too, PostgreSQL took the primary key newest first and
    read every newer message of every other user to find the window of a user whose messages
    are not the newest (it assumes a user's rows spread evenly over the ids): 0.4-0.6 s behind
    1M other messages on the search benchmark's data (docs/benchmarks.md). The window may so
    hold a streaming reply or a system message; the scans filter them, the bounds only count
    rows to know where the scope ends."""
    clauses, params = _key_sql(scope)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    found = bounded_rows(
        "SELECT MIN(w.id), MAX(w.id), COUNT(*) FROM (SELECT m.id FROM chat_messages m "  # noqa: S608
        f"{where}ORDER BY m.id DESC LIMIT %s) w",
        [*params, rows],
    )
    lowest, highest, count = found[0] if found else (None, None, 0)
    if lowest is None or highest is None:
        return None
    return Window(lowest_id=int(lowest), highest_id=int(highest), rows=int(count))


def _key_sql(scope: Scope) -> tuple[list[str], list[Any]]:
    """The clauses of a scope that an index on (key, id) answers alone."""
    clauses: list[str] = []
    params: list[Any] = []
    if scope.session_id is not None:
        clauses.append("m.session_id = %s")
        params.append(scope.session_id)
    elif scope.owner_id is not None:
        clauses.append("m.owner_id = %s")
        params.append(scope.owner_id)
    if scope.below_id is not None:
        clauses.append("m.id < %s")
        params.append(scope.below_id)
    return clauses, params


# A message as recall reads it in raw SQL: (id, role, status, created_at, content).
MessageRow = tuple[int, str, str, datetime, str]
# The same as window_rows gives it: created_at as the database gave it (stamp_datetime reads it).
RawMessageRow = tuple[int, str, str, Any, str]


def window_rows(*, scope: Scope, rows: int, from_id: int | None = None) -> list[RawMessageRow]:
    """The scope's newest `rows` messages (with `from_id`: of those at or above it) as (id,
    role, status, created_at, content), newest first, whatever their role and status (the
    caller filters, and counts what the key chose: chat/search/archive_window.py). For a
    caller that matches many terms against them in memory (automatic recall): one statement
    instead of a scan per term.

    The rows as the driver gives them, created_at included (an ISO string on SQLite; the
    caller reads it with stamp_datetime). Each of 1,000 rows converted and typed here, and its
    created_at parsed by Django's SQLite converter, made this 2.7 ms instead of 1.3 (bench
    ttft's imported session, in process), before the first token of every first send.

    The ids are chosen by the scope's key alone, as window_bounds does and for the same
    reason, in a derived table the rows are then joined to (and the owner checked on). As
    `id IN (that LIMIT subquery)` with the filters beside it, PostgreSQL took the subquery for
    one row and ran it again for every message of the window: 77 ms for a 1,000-message
    session among 1.2M messages, against 1.6 ms now (the ttft benchmark's data)."""
    clauses, params = _key_sql(scope)
    if from_id is not None:
        clauses.append("m.id >= %s")
        params.append(from_id)
    key = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    owner, owner_params = (
        ("", []) if scope.owner_id is None else ("WHERE o.owner_id = %s ", [scope.owner_id])
    )
    # SQLite: an expression (a unary plus, a no-op) has no declared type, so the driver leaves
    # the column's text as it is instead of calling Django's datetime converter on each row.
    created_at = "+o.created_at" if connection.vendor == "sqlite" else "o.created_at"
    found = bounded_rows(
        f"SELECT o.id, o.role, o.status, {created_at}, o.content FROM ("  # noqa: S608
        f"SELECT m.id FROM chat_messages m {key}ORDER BY m.id DESC LIMIT %s) w "
        f"JOIN chat_messages o ON o.id = w.id {owner}ORDER BY o.id DESC",
        [*params, rows, *owner_params],
        timestamps=True,
    )
    return cast(list[RawMessageRow], found)


def rows_by_id(*, scope: Scope, ids: list[int]) -> list[MessageRow]:
    """The scope's messages among `ids` as (id, role, status, created_at, content), whatever
    their role and status (the caller filters). Raw SQL, as window_rows: recall reads these
    before the first token, and the ORM's statement building and row conversion cost more
    than the database's answer."""
    if not ids:
        return []
    where, params = _scope_sql(Scope(owner_id=scope.owner_id, session_id=scope.session_id))
    marks = ", ".join(["%s"] * len(ids))
    found = bounded_rows(
        "SELECT m.id, m.role, m.status, m.created_at, m.content FROM chat_messages m "  # noqa: S608
        f"WHERE {where} AND m.id IN ({marks})",
        [*params, *ids],
        timestamps=True,
    )
    return _message_rows(found)


def _message_rows(found: list[tuple[Any, ...]]) -> list[MessageRow]:
    """(id, role, status, created_at, content) rows as raw SQL gave them, typed."""
    return [
        (int(mid), str(role), str(status), stamp_datetime(created_at), str(content))
        for mid, role, status, created_at, content in found
    ]


def stamp_datetime(value: Any) -> datetime:
    """A created_at as the database gave it (raw SQL on SQLite: an ISO string), aware UTC."""
    if isinstance(value, datetime):
        if value.tzinfo is UTC:
            return value
        return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def window_hits(*, scope: Scope, query: str, window: Window, limit: int) -> list[int]:
    """Ids of the window's messages that contain `query`, newest first."""
    where, params = _scope_sql(scope)
    contains, contains_params = _contains_sql(query)
    # Bounded on both sides. With `id >= lowest` alone PostgreSQL may walk the primary key down
    # from the newest message of the whole table, filtering on the owner: through every newer
    # message of every other user first (1M of them and 3-5 s on the search benchmark's data,
    # docs/benchmarks.md). Between the window's two ends any plan reads the window's range only.
    rows = bounded_rows(
        f"SELECT m.id FROM chat_messages m WHERE {where} AND m.id >= %s AND m.id <= %s "  # noqa: S608
        f"AND {contains} ORDER BY m.id DESC LIMIT %s",
        [*params, window.lowest_id, window.highest_id, *contains_params, limit],
    )
    return [int(r[0]) for r in rows]


def index_hits(*, scope: Scope, query: str, limit: int) -> list[int]:
    """Ids of the scope's messages that contain `query` (3+ characters), newest first, found
    through the trigram index."""
    sql, params = _index_sql(scope=scope, query=query, limit=limit, arm=0)
    return [int(r[1]) for r in bounded_rows(sql, params)]


def index_hits_many(*, scope: Scope, queries: list[str], limit: int) -> dict[str, list[int]]:
    """index_hits of each of `queries`, in one statement (UNION ALL): automatic recall looks
    up several rare terms before the first token, and on PostgreSQL planning each lookup and
    its round trip cost as much as running it.

    For terms known to be rare (recall asks only those in under 0.5% of the window above):
    on PostgreSQL every match of each is read (through the trigram index, as the planner
    normally chooses for a rare term) and sorted, never found by walking the primary key down
    from the paging position and stopping at the LIMIT. PostgreSQL guesses a LIKE's share
    of rows from the pattern alone: it took "%118%" for 8,458 rows of the ttft benchmark's
    1.1M, walked the key for the 40 newest, and read 677k rows to find them among the 127
    there were (0.7-2.4 s before a send's first token, against 1-3 ms)."""
    if not queries:
        return {}
    arms = [
        _index_sql(scope=scope, query=q, limit=limit, arm=i, sparse=True)
        for i, q in enumerate(queries)
    ]
    if connection.vendor == "sqlite":
        # A compound SELECT takes ORDER BY and LIMIT only at its end: each arm is a subquery.
        # The arms are this module's fixed SQL; every value is a bound parameter.
        sql = " UNION ALL ".join(f"SELECT * FROM ({arm})" for arm, _ in arms)  # noqa: S608
    else:
        sql = " UNION ALL ".join(f"({arm})" for arm, _ in arms)
    found: dict[str, list[int]] = {q: [] for q in queries}
    for arm, mid in bounded_rows(sql, [p for _, params in arms for p in params]):
        found[queries[int(arm)]].append(int(mid))
    return found


def _index_sql(
    *, scope: Scope, query: str, limit: int, arm: int, sparse: bool = False
) -> tuple[str, list[Any]]:
    """One index lookup's statement, its rows (arm, id): `arm` tells the caller which.
    `sparse`: the query is rare (index_hits_many); PostgreSQL only."""
    if not indexable(query):
        raise ValueError("the trigram index has nothing to look up in this query")
    where, params = _scope_sql(scope)
    if connection.vendor == "sqlite":
        # CROSS JOIN makes the FTS table the outer loop (SQLite keeps the order as written):
        # it walks the matches newest first and stops at `limit`, where the other order would
        # visit every message of the session. rowid is the message id.
        # The paging bound on the FTS side as well, so FTS5 starts its walk there.
        below = "" if scope.below_id is None else "AND f.rowid < %s "
        return (
            f"SELECT {int(arm)} AS arm, f.rowid FROM chat_message_fts f "  # noqa: S608
            f"CROSS JOIN chat_messages m ON m.id = f.rowid WHERE chat_message_fts MATCH %s "
            f"{below}AND {where} ORDER BY f.rowid DESC LIMIT %s",
            [
                _fts_phrase(query),
                *([] if scope.below_id is None else [scope.below_id]),
                *params,
                limit,
            ],
        )
    contains, contains_params = _contains_sql(query)
    # `m.id + 0` is an order no index yields: no plan can walk an index in that order and stop
    # at the LIMIT, so every match is read and sorted (index_hits_many says why).
    order = "m.id + 0" if sparse else "m.id"
    return (
        f"SELECT {int(arm)} AS arm, m.id FROM chat_messages m WHERE {where} "  # noqa: S608
        f"AND {contains} ORDER BY {order} DESC LIMIT %s",
        [*params, *contains_params, limit],
    )


def caseless(query: str) -> bool:
    """Whether no character of `query` has case (Chinese, digits, punctuation): then its
    case-insensitive match is a plain one, and the scan need not fold every row's text."""
    return all(c.lower() == c == c.upper() and c.casefold() == c for c in query)


def _contains_sql(query: str) -> tuple[str, list[Any]]:
    if connection.vendor == "postgresql":
        # ILIKE, not UPPER() LIKE: pg_trgm's GIN operator class serves ILIKE on the column (and
        # LIKE). ILIKE lowers each row's text first: for a caseless query (a Chinese word, the
        # common short query, which only the window scan answers) LIKE finds the same rows
        # a third of the time (5.5 against 16.5 ms for 5,000 messages on the benchmark's data).
        operator = "LIKE" if caseless(query) else "ILIKE"
        return f"m.content {operator} %s ESCAPE '\\'", [f"%{_like_escape(query)}%"]
    # instr() has no wildcards to escape. SQLite's lower() folds ASCII only, where FTS5 folds
    # all of Unicode: a query with a non-ASCII letter that has case ("Ärger", "Код") is
    # compared through Python's casefold, registered on the connection, so the window scan
    # finds what the index would. Only then: a Python call per row costs.
    if caseless(query):
        # lower() copies each row's text to fold letters the query does not have: half the
        # time without it (4.4 against 8.7 ms for 5,000 messages).
        return "instr(m.content, %s) > 0", [query]
    if any(ord(c) > 127 and c.lower() != c.upper() for c in query):
        return f"instr({_FOLD}(m.content), {_FOLD}(%s)) > 0", [query]
    return "instr(lower(m.content), lower(%s)) > 0", [query]


_FOLD = "cadau_casefold"


def _casefold(value: Any) -> Any:
    return value.casefold() if isinstance(value, str) else value


def sqlite_functions_register(*, sender: Any, connection: Any, **kwargs: Any) -> None:
    """connection_created receiver (ChatConfig.ready): the SQL functions the search uses."""
    if connection.vendor == "sqlite":
        connection.connection.create_function(_FOLD, 1, _casefold, deterministic=True)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _fts_phrase(query: str) -> str:
    # One FTS5 string token: every character literal, quotes doubled. With the trigram
    # tokenizer a phrase is a substring match, case-folded.
    return '"' + query.replace('"', '""') + '"'


def search_index_tidy() -> None:
    """SQLite: merge some of the FTS5 index's segments (migration 0008 turned off its merging
    in the writing transaction, where it stalled a send before its first token). Called after
    a reply's final write, which the user is not waiting on; does nothing while no level holds
    enough segments to merge. PostgreSQL: nothing (its GIN index keeps itself)."""
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chat_message_fts(chat_message_fts, rank) VALUES ('merge', %s)",
            [MERGE_PAGES],
        )
