"""Reads. The ownership check lives here, once: every route that takes a session or agent id
goes through `session_for_user` / `agent_for_user`, which raise NotFound (a 404) for anything
the user does not own, so another user's object is indistinguishable from a missing one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import CASCADE, PROTECT, RESTRICT, Model, Q, QuerySet
from django.db.models.functions import Substr

from cadau.contextconfig import ContextConfig
from chat.context import context_budget_from_row, context_config_for
from chat.context.budget import with_context_runes
from chat.context.heading import summary_prefix
from chat.context.prompt import agent_model
from chat.cursors import (
    decode_message_cursor,
    decode_session_list_cursor,
    encode_message_cursor,
    encode_session_list_cursor,
)
from chat.errors import NotFound
from chat.llm import provider_info
from chat.models import Agent, ChatMessage, ChatSession, ContextSnapshot, MessageRole
from chat.queries import message_exists, message_rows, session_owned_row
from chat.search.recall_warm import recall_window_warm_start
from chat.text import ascii_int

AGENT_LIST_MAX = 500


def _parse_id(value: Any) -> int:
    parsed = ascii_int(value)
    if parsed is None or parsed <= 0 or parsed > 2**63 - 1:
        raise NotFound()
    return parsed


def session_for_user(*, user: Any, session_id: Any) -> ChatSession:
    """The user's session, with its owner and agent, or NotFound. The owner is read afresh
    with it: a user deactivated since they logged in (their socket still open, their cookie
    not yet expired) owns nothing any more."""
    if user is None or not user.is_authenticated:
        raise NotFound()
    found = session_owned_row(session_id=_parse_id(session_id), owner_id=user.pk)
    if found is None:
        raise NotFound()
    return found


def session_opened_for_user(*, user: Any, session_id: Any) -> ChatSession:
    """session_for_user, for a chat being opened (its page, its socket): a send is likely to
    follow, and recall's window is read for it meanwhile (chat/search/recall_warm.py)."""
    session = session_for_user(user=user, session_id=session_id)
    recall_window_warm_start(session=session)
    return session


def agent_for_user(*, user: Any, agent_id: Any) -> Agent:
    if user is None or not user.is_authenticated:
        raise NotFound()
    try:
        return Agent.objects.get(pk=_parse_id(agent_id), owner=user)
    except Agent.DoesNotExist:
        raise NotFound() from None


def agent_list(*, user: Any, limit: int = AGENT_LIST_MAX) -> list[Agent]:
    """The user's agents, newest first (agent_owner_id_idx)."""
    return list(Agent.objects.filter(owner_id=user.pk).order_by("-id")[:limit])


# --- Paging ------------------------------------------------------------------------------------
# Every page is a keyset read (never OFFSET): a bounded number of index range scans whatever the
# session size, and stable under concurrent inserts (a new message never shifts a page).


@dataclass(frozen=True, slots=True)
class SessionPage:
    sessions: list[ChatSession]
    next_cursor: str | None


def session_list(*, user: Any, limit: int, cursor: str | None = None) -> SessionPage:
    """The user's sessions, most recent activity first (chat_session_activity_idx). One query:
    each row also carries its context-budget estimate, so the list is never N+1."""
    qs = ChatSession.objects.filter(owner=user).select_related("agent", "owner")
    if cursor is not None:
        position = decode_session_list_cursor(cursor=cursor, owner_id=user.pk)
        qs = qs.filter(
            Q(last_activity_at__lt=position.last_activity_at)
            | Q(last_activity_at=position.last_activity_at, id__lt=position.session_id)
        )
    rows = list(with_context_runes(qs.order_by("-last_activity_at", "-id"))[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_session_list_cursor(
            owner_id=user.pk, last_activity_at=rows[-1].last_activity_at, session_id=rows[-1].pk
        )
    return SessionPage(sessions=rows, next_cursor=next_cursor)


@dataclass(frozen=True, slots=True)
class HistoryPage:
    messages: list[ChatMessage]  # oldest first
    older_cursor: str | None  # None when the session's oldest message is on this page
    # Never None: at the live edge it is the cursor that later fetches newly arrived messages.
    newer_cursor: str
    at_live_edge: bool  # no message newer than this page exists (at read time)


def history_page(
    *,
    session: ChatSession,
    limit: int,
    before: str | None = None,
    after: str | None = None,
    around: int | None = None,
) -> HistoryPage:
    """One page of a session's messages, oldest first; no position means the newest page.

    At most two queries on chat_msg_session_id_idx: the page itself (limit + 1 rows: the extra
    row says whether more exist in the paging direction) and, where the page cannot tell, one
    EXISTS probe for the other side. Raises InvalidCursor, or NotFound for an `around` message
    that is not in this session."""
    if sum(x is not None for x in (before, after, around)) > 1:
        raise ValueError("history_page takes at most one of before, after, around")
    sid = session.pk
    messages = ChatMessage.objects.filter(session_id=sid)

    if around is not None:
        return _history_around(messages=messages, session_id=sid, limit=limit, target=around)

    if after is not None:
        bound = decode_message_cursor(
            cursor=after, kind="history", session_id=sid, direction="newer"
        ).message_id
        rows = list(message_rows(messages.filter(id__gt=bound), order="id", limit=limit + 1))
        has_newer = len(rows) > limit
        rows = rows[:limit]
        has_older = message_exists(messages.filter(id__lt=rows[0].pk if rows else bound + 1))
        return _history_result(
            session_id=sid, rows=rows, has_older=has_older, has_newer=has_newer, empty_at=bound
        )

    qs, upper = messages, None
    if before is not None:
        upper = decode_message_cursor(
            cursor=before, kind="history", session_id=sid, direction="older"
        ).message_id
        qs = qs.filter(id__lt=upper)
    rows = list(message_rows(qs, order="-id", limit=limit + 1))
    has_older = len(rows) > limit
    rows = rows[:limit][::-1]
    if upper is None:
        has_newer = False  # the newest page is the live edge by definition
        empty_at = 0
    else:
        empty_at = upper - 1
        has_newer = message_exists(messages.filter(id__gt=rows[-1].pk if rows else empty_at))
    return _history_result(
        session_id=sid, rows=rows, has_older=has_older, has_newer=has_newer, empty_at=empty_at
    )


def _history_around(
    *, messages: QuerySet[ChatMessage], session_id: int, limit: int, target: int
) -> HistoryPage:
    """A window with `target` in the middle (a click in the turns navigator). Near either end
    of the session the window fills up from the other side, so it stays `limit` long."""
    # Both reads take up to limit + 1 rows so the window can shift towards whichever side has
    # messages, and the extra row still tells whether more exist beyond it.
    newer = list(message_rows(messages.filter(id__gte=target), order="id", limit=limit + 1))
    if not newer or newer[0].pk != target:
        raise NotFound()
    older = list(message_rows(messages.filter(id__lt=target), order="-id", limit=limit + 1))
    want_older = (limit - 1) // 2
    want_newer = limit - want_older  # includes the target itself
    if len(newer) < want_newer:
        want_older = limit - len(newer)
    elif len(older) < want_older:
        want_newer = limit - len(older)
    take_older, take_newer = older[:want_older], newer[:want_newer]
    return _history_result(
        session_id=session_id,
        rows=take_older[::-1] + take_newer,
        has_older=len(older) > len(take_older),
        has_newer=len(newer) > len(take_newer),
        empty_at=0,
    )


def _history_result(
    *, session_id: int, rows: list[ChatMessage], has_older: bool, has_newer: bool, empty_at: int
) -> HistoryPage:
    """`empty_at`: the id an empty page's newer_cursor continues after, so a client polling an
    empty session (or an exhausted `after`) never needs to invent a position."""
    older_cursor = None
    if rows and has_older:
        older_cursor = encode_message_cursor(
            kind="history", session_id=session_id, message_id=rows[0].pk, direction="older"
        )
    newer_cursor = encode_message_cursor(
        kind="history",
        session_id=session_id,
        message_id=rows[-1].pk if rows else max(0, empty_at),
        direction="newer",
    )
    return HistoryPage(
        messages=rows,
        older_cursor=older_cursor,
        newer_cursor=newer_cursor,
        at_live_edge=not has_newer,
    )


TURN_PREVIEW_CHARS = 120
# Read only a prefix of each question: a pasted 100 KB log must not travel to build 120
# characters. Generous, so leading whitespace/blank lines still leave text to show.
_TURN_PREVIEW_READ = 1000
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Turn:
    message_id: int
    created_at: datetime
    preview: str


@dataclass(frozen=True, slots=True)
class TurnsPage:
    turns: list[Turn]  # newest first
    next_cursor: str | None  # the next (older) page; None once the first question is listed


def turn_preview(text: str) -> str:
    collapsed = _WHITESPACE.sub(" ", text).strip()
    if len(collapsed) <= TURN_PREVIEW_CHARS:
        return collapsed
    return collapsed[: TURN_PREVIEW_CHARS - 1].rstrip() + "…"


def turns_page(*, session: ChatSession, limit: int, cursor: str | None = None) -> TurnsPage:
    """The user's questions in a session, NEWEST first, paging towards older ones.

    Newest first because the navigator opens at the bottom of the conversation, where the
    reader is, and a 5000-turn session must not make them page through its beginning first;
    a client that wants chronological order reverses each page. One query, on the partial
    index chat_msg_user_turns_idx (role='user' only)."""
    qs = ChatMessage.objects.filter(session_id=session.pk, role=MessageRole.USER)
    if cursor is not None:
        position = decode_message_cursor(
            cursor=cursor, kind="turns", session_id=session.pk, direction="older"
        )
        qs = qs.filter(id__lt=position.message_id)
    rows = list(
        message_rows(qs, order="-id", limit=limit + 1)
        .annotate(head=Substr("content", 1, _TURN_PREVIEW_READ))
        .values_list("id", "created_at", "head")
    )
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_message_cursor(
            kind="turns", session_id=session.pk, message_id=rows[-1][0], direction="older"
        )
    turns = [
        Turn(message_id=mid, created_at=created_at, preview=turn_preview(head or ""))
        for mid, created_at, head in rows
    ]
    return TurnsPage(turns=turns, next_cursor=next_cursor)


def session_snapshots_page(
    *, session: ChatSession, limit: int, before: int | None = None
) -> tuple[list[ContextSnapshot], int | None]:
    """One page of the session's snapshots, newest first, keyset-paged by id (`before`: the
    last id of the previous page). Returns the page and the `before` of the next one."""
    rows = ContextSnapshot.objects.filter(session_id=session.pk)
    if before is not None:
        rows = rows.filter(id__lt=before)
    page = list(rows.order_by("-id")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return page, (page[-1].pk if more and page else None)


def session_snapshots(*, session: ChatSession, limit: int) -> list[ContextSnapshot]:
    """The newest `limit` snapshots (chat_snapshot_session_idx): a long chat compacts every few
    turns, so the full list is unbounded and only the recent ones matter for inspection."""
    return list(ContextSnapshot.objects.filter(session_id=session.pk).order_by("-id")[:limit])


def session_message_batch(
    *, session_id: int, after_id: int, through_id: int, limit: int
) -> list[ChatMessage]:
    """Up to `limit` messages of the session with after_id < id <= through_id, oldest first:
    one step of an export walking the session by id (chat_msg_session_id_idx), so memory stays
    flat whatever the session's length. `through_id` pins the end where the walk began: a
    session still being written to does not make the walk chase it."""
    qs = ChatMessage.objects.filter(session_id=session_id, id__gt=after_id, id__lte=through_id)
    return list(message_rows(qs, order="id", limit=limit))


def session_last_message_id(*, session_id: int) -> int:
    last = message_rows(ChatMessage.objects.filter(session_id=session_id), order="-id", limit=1)
    return next((m.pk for m in last.only("id")), 0)


# --- what the adapters show of the context engine and the model ------------------------------
# The adapters (REST, pages, admin) read these here, never from chat.context or chat.llm: the
# import-linter contract "adapters reach the engine through selectors and services" says so.


def session_budget(*, session: ChatSession) -> dict[str, Any]:
    """The session's `context_budget`, from the row (annotated by sessions_with_budget on a
    list, read from its context otherwise)."""
    return context_budget_from_row(session=session)


def sessions_with_budget(sessions: QuerySet[ChatSession]) -> QuerySet[ChatSession]:
    """A session list annotated for session_budget: one query however many rows."""
    return with_context_runes(sessions)


def session_summary_heading(*, session: ChatSession) -> str:
    """The heading the summary is sent under, in the summary's language."""
    return summary_prefix(summary=session.context_summary)


def session_context_config(*, session: ChatSession | None) -> ContextConfig:
    """The context settings in force for the session (an agent may set its own), or the
    server's where no session is open."""
    return context_config_for(session=session) if session is not None else settings.CHAT_CONTEXT


def model_provider() -> dict[str, Any]:
    """Which model answers: its provider's name, model, whether it is the offline one, and its
    base URL (staff only, the adapter decides)."""
    return dict(provider_info())


def session_default_model(*, session: ChatSession | None) -> str:
    """What "default" means in a chat's model picker: its agent's model, else the server's."""
    agent = session.agent if session is not None else None
    return agent_model(agent=agent) or str(provider_info()["model"])


@dataclass(frozen=True, slots=True)
class Cascade:
    """What deleting some rows takes with it (`rows_cascading`)."""

    counts: dict[type[Model], int]
    # Models whose rows would refuse the delete (PROTECT, RESTRICT), with how many.
    protected: dict[type[Model], int]


# Deep enough for user -> session -> message -> vector; a model met again is not walked twice.
CASCADE_DEPTH = 4


def rows_cascading(*, queryset: QuerySet[Any]) -> Cascade:
    """The rows deleting `queryset` deletes, by model, counted and never read: one COUNT over
    a subquery of their parents per relation that cascades (Django's delete confirmation read
    and listed every one, a million messages for one chat)."""
    counts: dict[type[Model], int] = {queryset.model: queryset.count()}
    protected: dict[type[Model], int] = {}

    def walk(parents: QuerySet[Any], depth: int, seen: frozenset[type[Model]]) -> None:
        for rel in parents.model._meta.related_objects:
            child = rel.related_model
            if not (isinstance(child, type) and issubclass(child, Model)):
                continue
            # SET_NULL and the like leave the rows in place.
            if rel.on_delete not in (CASCADE, PROTECT, RESTRICT):
                continue
            rows = child._base_manager.filter(**{f"{rel.field.name}__in": parents.values("pk")})
            found = rows.count()
            if not found:
                continue
            if rel.on_delete is not CASCADE:
                protected[child] = protected.get(child, 0) + found
                continue
            counts[child] = counts.get(child, 0) + found
            if depth < CASCADE_DEPTH and child not in seen:
                walk(rows, depth + 1, seen | {child})

    walk(queryset, 1, frozenset({queryset.model}))
    return Cascade(counts=counts, protected=protected)


def user_live_session_ids(*, user_id: int) -> list[int]:
    """The user's sessions with a reply generating, in any process (a `streaming` row)."""
    return list(
        ChatMessage.objects.filter(session__owner_id=user_id)
        .replies_live()
        .values_list("session_id", flat=True)
        .distinct()
    )
