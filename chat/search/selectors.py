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

from chat.cursors import decode_search_cursor, encode_search_cursor
from chat.errors import InvalidInput, SearchTimeout
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search import backends
from chat.search.backends import MIN_INDEXED_QUERY, Scope
from chat.search.snippets import snippet_for

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
    short = len(query) < MIN_INDEXED_QUERY
    window = backends.window_bounds(
        scope=scope, rows=SHORT_QUERY_WINDOW_ROWS if short else WINDOW_ROWS
    )
    if window is None:
        return IdsResult(ids=[], next_below=None, mode="scan" if short else "index")
    asked = SHORT_QUERY_WINDOW_ROWS if short else WINDOW_ROWS
    ids = backends.window_hits(
        scope=scope, query=query, lowest_id=window.lowest_id, limit=limit + 1
    )
    scope_ends_in_window = window.rows < asked
    if len(ids) <= limit and not scope_ends_in_window:
        if short:
            # No index to ask: the page ends where the window does, and the cursor goes on.
            return IdsResult(ids=ids, next_below=window.lowest_id, mode="scan")
        below = Scope(
            owner_id=scope.owner_id,
            session_id=scope.session_id,
            role=scope.role,
            below_id=window.lowest_id,
        )
        ids += backends.index_hits(scope=below, query=query, limit=limit + 1 - len(ids))
    mode: Mode = "scan" if short else "index"
    if len(ids) > limit:
        return IdsResult(ids=ids[:limit], next_below=ids[limit - 1], mode=mode)
    return IdsResult(ids=ids, next_below=None, mode=mode)


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
        rows = list(
            ChatMessage.objects.filter(id__in=result.ids).values_list(
                "id", "session_id", "session__title", "role", "created_at", "content"
            )
        )
    by_id = {row[0]: row for row in rows}
    hits = []
    for message_id in result.ids:
        row = by_id.get(message_id)
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


@contextmanager
def search_deadline(seconds: float | None = None) -> Iterator[None]:
    """Stop the statements inside after `seconds`, as SearchTimeout. PostgreSQL: a
    transaction-local statement_timeout; SQLite: a progress handler that interrupts the
    statement once the time is up. Default: TIMEOUT_SECONDS."""
    seconds = TIMEOUT_SECONDS if seconds is None else seconds
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    # A literal: SET takes no bind parameters. An int, so nothing to quote.
                    cursor.execute(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
                yield
                # Inside a caller's transaction (a savepoint here) SET LOCAL would outlive
                # this block; put the server's own limit back.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL statement_timeout = DEFAULT")
        except OperationalError as exc:
            if "statement timeout" in str(exc) or "canceling statement" in str(exc):
                raise SearchTimeout(_TIMEOUT_MESSAGE) from exc
            raise
        return
    if connection.vendor != "sqlite":  # pragma: no cover - the two supported databases
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    deadline = monotonic() + seconds
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
            raise SearchTimeout(_TIMEOUT_MESSAGE) from exc
        raise
    finally:
        raw.set_progress_handler(None, 0)


_TIMEOUT_MESSAGE = "The search took too long. Search one chat, or use more characters."
