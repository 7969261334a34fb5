"""Reads for message search. See chat/search/backends.py for how a search walks the messages."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from time import monotonic
from typing import Any, Literal

from django.db import OperationalError, connection, transaction
from django.db.models.functions import Length, Substr

from chat.cursors import decode_search_cursor, encode_search_cursor
from chat.errors import InvalidInput, SearchTimeout
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search import backends
from chat.search.backends import Scope
from chat.search.snippets import query_pattern, snippet_for

QUERY_MAX_CHARS = 200
LIMIT_DEFAULT = 20
LIMIT_MAX = 50
# Messages tested one by one, newest first, before the index takes over (backends.py). A common
# term fills its page inside it; one request never reads more rows than this plus its page.
WINDOW_ROWS = 1000
# A query too short for the trigram index is a window scan only: each request walks this many
# messages and its cursor continues below them.
SHORT_QUERY_WINDOW_ROWS = 5000
# A search that matches a lot of text sparsely (outside its scope, mostly) could walk a large
# index; past this it stops with a 503 asking for a narrower query rather than hold a worker.
TIMEOUT_SECONDS = 5.0
# SQLite checks the clock every this many virtual-machine steps (~a millisecond of work).
PROGRESS_STEPS = 20_000

SEARCHABLE_ROLES = (MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL)

Mode = Literal["index", "scan"]


@dataclass(frozen=True, slots=True)
class IdsResult:
    ids: list[int]  # newest first, at most the limit asked for
    # The paging position that continues this search (only ids below it), or None when the
    # scope holds no more matches. Set even when `ids` is short: a short query's window scan
    # can end before the page fills.
    next_below: int | None
    mode: Mode


def search_query_clean(query: Any) -> str:
    """The query as searched, or InvalidInput: 1..200 characters once trimmed, no NUL."""
    if not isinstance(query, str):
        raise InvalidInput("Give the text to search for in `q`.")
    text = query.strip()
    if not text:
        raise InvalidInput("Give the text to search for in `q`.")
    if len(text) > QUERY_MAX_CHARS:
        raise InvalidInput(f"A search is at most {QUERY_MAX_CHARS} characters.")
    if "\x00" in text:
        raise InvalidInput("A search cannot contain a NUL character.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no stored text can contain it
        raise InvalidInput("A search must be valid Unicode text.") from None
    return text


def message_ids_search(*, scope: Scope, query: str, limit: int) -> IdsResult:
    """Ids of the scope's messages containing `query` (case-insensitive), newest first."""
    short = not backends.indexable(query)
    mode: Mode = "scan" if short else "index"
    asked = SHORT_QUERY_WINDOW_ROWS if short else WINDOW_ROWS
    window = backends.window_bounds(scope=scope, rows=asked)
    if window is None:
        return IdsResult(ids=[], next_below=None, mode=mode)
    ids = backends.window_hits(scope=scope, query=query, window=window, limit=limit + 1)
    scope_ends_in_window = window.rows < asked
    if len(ids) <= limit and not scope_ends_in_window:
        if short:
            # No index to ask: the page ends where the window does, and the cursor goes on.
            return IdsResult(ids=ids, next_below=window.lowest_id, mode=mode)
        below = Scope(
            owner_id=scope.owner_id,
            session_id=scope.session_id,
            role=scope.role,
            below_id=window.lowest_id,
        )
        ids += backends.index_hits(scope=below, query=query, limit=limit + 1 - len(ids))
    if len(ids) > limit:
        return IdsResult(ids=ids[:limit], next_below=ids[limit - 1], mode=mode)
    return IdsResult(ids=ids, next_below=None, mode=mode)


def message_ids_search_admin(*, query: str, limit: int) -> list[int]:
    """The admin's message search: every user's messages containing `query`, newest first, at
    most `limit`, under the search deadline. Raises InvalidInput, SearchTimeout."""
    text = search_query_clean(query)
    with search_deadline():
        return message_ids_search(scope=Scope(owner_id=None), query=text, limit=limit).ids


@dataclass(frozen=True, slots=True)
class SearchHit:
    message_id: int
    session_id: int
    session_title: str
    role: str
    created_at: datetime
    snippet: str
    highlights: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class SearchPage:
    hits: list[SearchHit]
    next_cursor: str | None
    mode: Mode


def _query_key(query: str) -> str:
    # The cursor is bound to its query without carrying the text (a cursor may end up in logs).
    return hashlib.sha256(query.casefold().encode()).hexdigest()[:16]


def message_search(
    *,
    user: Any,
    query: Any,
    session: ChatSession | None = None,
    role: Any = None,
    cursor: str | None = None,
    limit: int = LIMIT_DEFAULT,
) -> SearchPage:
    """The user's messages containing `query`, newest first, one page at a time.

    `session` (already owner-checked by the caller through `session_for_user`) narrows the
    search to it. Raises InvalidInput for a bad query, role or limit, InvalidCursor for a cursor
    of another search, SearchTimeout past TIMEOUT_SECONDS."""
    text = search_query_clean(query)
    if role in (None, ""):
        role = None
    elif role not in SEARCHABLE_ROLES:
        raise InvalidInput("`role` is one of user, assistant, tool.")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIMIT_MAX:
        raise InvalidInput(f"`limit` is between 1 and {LIMIT_MAX}.")
    session_id = session.pk if session is not None else None
    key = _query_key(text)
    below = None
    if cursor is not None:
        below = decode_search_cursor(
            cursor=cursor,
            owner_id=user.pk,
            session_id=session_id or 0,
            role=role or "",
            query_key=key,
        ).message_id
    scope = Scope(owner_id=user.pk, session_id=session_id, role=role, below_id=below)
    with search_deadline():
        result = message_ids_search(scope=scope, query=text, limit=limit)
        rows = _hit_rows(ids=result.ids, query=text)
    hits = []
    for message_id in result.ids:
        row = rows.get(message_id)
        if row is None:  # deleted (truncated) between the two reads
            continue
        _, sid, title, got_role, created_at, content = row
        snip = snippet_for(content, text)
        hits.append(
            SearchHit(
                message_id=message_id,
                session_id=sid,
                session_title=title,
                role=got_role,
                created_at=created_at,
                snippet=snip.text,
                highlights=snip.highlights,
            )
        )
    next_cursor = None
    if result.next_below is not None:
        next_cursor = encode_search_cursor(
            owner_id=user.pk,
            session_id=session_id or 0,
            role=role or "",
            query_key=key,
            message_id=result.next_below,
        )
    return SearchPage(hits=hits, next_cursor=next_cursor, mode=result.mode)


# What a hit's row brings of its content: enough for a snippet around a match near the start,
# not the 200,000 characters a pasted log may hold (a page is up to 50 hits).
HIT_CONTENT_READ = 20_000


def _hit_rows(*, ids: list[int], query: str) -> dict[int, tuple[Any, ...]]:
    rows = {
        row[0]: row
        for row in ChatMessage.objects.filter(id__in=ids)
        .annotate(head=Substr("content", 1, HIT_CONTENT_READ), length=Length("content"))
        .values_list("id", "session_id", "session__title", "role", "created_at", "head", "length")
    }
    pattern = query_pattern(query)
    # The few whose match lies beyond the prefix: read whole, so the snippet shows the match.
    far = [
        mid for mid, row in rows.items() if row[6] > HIT_CONTENT_READ and not pattern.search(row[5])
    ]
    if far:
        whole = dict(ChatMessage.objects.filter(id__in=far).values_list("id", "content"))
        for mid in far:
            if mid in whole:
                rows[mid] = (*rows[mid][:5], whole[mid], rows[mid][6])
    return {mid: row[:6] for mid, row in rows.items()}


@contextmanager
def search_deadline(seconds: float | None = None) -> Iterator[None]:
    """Stop the search inside after `seconds` in all (default TIMEOUT_SECONDS), as
    SearchTimeout: every statement of it read through backends.bounded_rows gets what is left
    of the time (backends.DEADLINE; PostgreSQL: a statement_timeout sent with the statement,
    inside a caller's transaction until the block ends, then the caller's own limit back),
    and SQLite's progress handler interrupts any statement once the time is up.
    SQLite's bound is soft: FTS5 merges a term's posting lists inside one step, where the
    handler is not called (tens of milliseconds on a large index)."""
    seconds = TIMEOUT_SECONDS if seconds is None else seconds
    token = backends.DEADLINE.set(monotonic() + seconds)
    try:
        if connection.vendor == "postgresql":
            with _postgres_deadline():
                yield
        elif connection.vendor == "sqlite":
            with _sqlite_deadline():
                yield
        else:  # pragma: no cover - the two supported databases
            yield
    finally:
        backends.DEADLINE.reset(token)


@contextmanager
def _postgres_deadline() -> Iterator[None]:
    # Outside a transaction (a send's recall, the search API), each statement read through
    # backends.bounded_rows carries its own limit in the same message: one implicit
    # transaction that ends with it. Nothing to open, read, put back or commit: a send's recall
    # lookup took five round trips before its first token (BEGIN, the limit, the lookup, the
    # limit back, COMMIT), now one. Inside a caller's transaction (or where parameters are
    # bound on the server, and one execute takes one statement), the limit is set in a
    # savepoint and the caller's put back after it.
    per_statement = not connection.in_atomic_block and backends.pg_client_binding()
    mode = backends.PG_PER_STATEMENT.set(per_statement)
    try:
        if per_statement:
            yield
        else:
            with _postgres_savepoint_deadline():
                yield
    except OperationalError as exc:
        if "statement timeout" in str(exc) or "canceling statement" in str(exc):
            raise SearchTimeout(backends.TIMEOUT_MESSAGE) from exc
        raise
    finally:
        backends.PG_PER_STATEMENT.reset(mode)


@contextmanager
def _postgres_savepoint_deadline() -> Iterator[None]:
    deadline = backends.DEADLINE.get() or monotonic()
    seconds = max(0.001, deadline - monotonic())
    token = backends.PG_TIMEOUT.set(seconds)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # The caller's limit, to put back, and the search's own, in one round trip.
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), "
                    "set_config('statement_timeout', %s, true)",
                    [str(max(1, int(seconds * 1000)))],
                )
                (before, _) = cursor.fetchone()
            yield
            # Inside a caller's transaction (a savepoint here) SET LOCAL would outlive this
            # block: the caller's limit back, as it was.
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
    finally:
        backends.PG_TIMEOUT.reset(token)


@contextmanager
def _sqlite_deadline() -> Iterator[None]:
    deadline = backends.DEADLINE.get() or monotonic()
    connection.ensure_connection()
    raw = connection.connection
    timed_out = False

    def check() -> int:
        nonlocal timed_out
        timed_out = monotonic() > deadline
        return 1 if timed_out else 0  # non-zero interrupts the running statement

    raw.set_progress_handler(check, PROGRESS_STEPS)
    try:
        yield
    except OperationalError as exc:
        if timed_out:
            raise SearchTimeout(backends.TIMEOUT_MESSAGE) from exc
        raise
    finally:
        raw.set_progress_handler(None, 0)
