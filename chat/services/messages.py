"""Writes of chat messages for a turn: the user message and the assistant reply row.

A turn starts under the session row lock, so idempotency on `client_id`, "one reply at a time"
and the denormalised counters are decided by one writer at a time, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from chat.api.errors import ApiError
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.selectors import message_rows, session_for_user
from chat.services import context as ctx
from chat.services.events import event_publish_on_commit

# A reply row still `streaming` with no progress saved for this long belongs to a dead process.
STALE_STREAMING_SECONDS = 120
MAX_CONTENT_RUNES = 200_000
MAX_CLIENT_ID = 64


@dataclass(slots=True)
class TurnStart:
    user_message: ChatMessage
    assistant_message: ChatMessage | None
    # False when client_id matched an earlier send: nothing new was stored.
    created: bool


def message_payload(message: ChatMessage) -> dict[str, Any]:
    """The contract's message object (API and events share it)."""
    return {
        "id": message.pk,
        "session_id": message.session_id,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "created_at": message.created_at.isoformat().replace("+00:00", "Z"),
        "client_id": message.client_id,
        "tool_calls": message.tool_calls,
        "tool_call_id": message.tool_call_id or None,
        "metadata": message.metadata,
    }


def _reply_to(user_message: ChatMessage) -> ChatMessage | None:
    """The newest assistant row answering `user_message`. Replies never interleave, so a turn's
    rows lie between its user message and the next one: bound the scan to that id range (a JSON
    lookup over a long session would otherwise read all of it)."""
    turn = ChatMessage.objects.filter(session_id=user_message.session_id, id__gt=user_message.pk)
    next_user = list(
        message_rows(turn.filter(role=MessageRole.USER), order="id", limit=1).values_list(
            "id", flat=True
        )
    )
    if next_user:
        turn = turn.filter(id__lt=next_user[0])
    replies = turn.filter(role=MessageRole.ASSISTANT, metadata__reply_to=user_message.pk)
    return message_rows(replies, order="-id", limit=1).first()


def _reply_active(session_id: int) -> bool:
    """A live reply in the session? EXISTS without ORDER BY, so both databases answer from the
    partial index chat_msg_streaming_idx (which holds only the few streaming rows)."""
    fresh_since = timezone.now() - timedelta(seconds=STALE_STREAMING_SECONDS)
    return ChatMessage.objects.filter(
        session_id=session_id, status=MessageStatus.STREAMING, updated_at__gte=fresh_since
    ).exists()


def _reply_active_else_sweep(session_id: int) -> bool:
    """`_reply_active`, and when no reply is live, fail the session's stale `streaming` rows: a
    reply orphaned by a crash shortly before the last restart escapes the start-up sweep, and
    the session's next send finishes it off. One read of the partial index for both."""
    rows = list(
        ChatMessage.objects.filter(session_id=session_id, status=MessageStatus.STREAMING).only(
            "id", "updated_at", "metadata"
        )
    )
    fresh_since = timezone.now() - timedelta(seconds=STALE_STREAMING_SECONDS)
    if any(row.updated_at >= fresh_since for row in rows):
        return True
    for row in rows:
        _mark_interrupted(row)
    return False


def _mark_interrupted(message: ChatMessage) -> None:
    message.status = MessageStatus.FAILED
    message.metadata = {**message.metadata, "error": "interrupted: the server stopped"}
    message.save(update_fields=["status", "metadata", "updated_at"])


def validate_content(*, content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise ApiError("content must be a non-empty string", code="invalid")
    if len(content) > MAX_CONTENT_RUNES:
        raise ApiError(
            f"content has {len(content)} characters; the limit is {MAX_CONTENT_RUNES}",
            code="message_too_large",
        )
    return content


def validate_client_id(*, client_id: Any) -> str | None:
    if client_id is None or client_id == "":
        return None
    if not isinstance(client_id, str) or len(client_id) > MAX_CLIENT_ID:
        raise ApiError(f"client_id must be a string of at most {MAX_CLIENT_ID} characters")
    return client_id


def send_checks(
    *, user: Any, session_id: Any, content: Any, client_id: Any
) -> tuple[ChatSession, str, str | None]:
    """A send's checks, in one order for REST and the WebSocket so both refuse the same input:
    the session (404 for someone else's), the content, the client_id, then whether the message
    could ever fit the model's context. Returns the session and the checked values."""
    session = session_for_user(user=user, session_id=session_id)
    content = validate_content(content=content)
    client_id = validate_client_id(client_id=client_id)
    ctx.context_check_fits(session=session, content=content)
    return session, content, client_id


def turn_start(
    *,
    session: ChatSession,
    content: str,
    client_id: str | None,
    wait_seconds: float | None = None,
) -> TurnStart:
    """Store the user message and an empty `streaming` reply row in one transaction.

    Idempotent on client_id: a repeat returns the original messages and stores nothing. While
    another reply of the session is generating, waits up to `wait_seconds` for it to finish
    (a queue of one), then refuses with `reply_in_progress`: replies never interleave."""
    wait = settings.CHAT_SEND_QUEUE_SECONDS if wait_seconds is None else wait_seconds
    deadline = time.monotonic() + wait
    while True:
        try:
            started = _turn_start_once(session=session, content=content, client_id=client_id)
        except IntegrityError:
            # Two sends with one client_id raced past the lookup; the loser returns the winner's.
            continue
        if started is not None:
            return started
        if time.monotonic() >= deadline:
            raise ApiError(
                "Another reply is still being generated in this session; try again when it "
                "finishes, or cancel it.",
                code="reply_in_progress",
                status_code=409,
            )
        time.sleep(0.1)


def _turn_start_once(
    *, session: ChatSession, content: str, client_id: str | None
) -> TurnStart | None:
    with transaction.atomic():
        # The agent comes along: the reply reuses this row (chat/services/reply.py, _prepare).
        locked = (
            ChatSession.objects.select_related("agent")
            .select_for_update(of=("self",))
            .get(pk=session.pk)
        )
        if client_id is not None:
            existing = ChatMessage.objects.filter(session=locked, client_id=client_id).first()
            if existing is not None:
                return TurnStart(
                    user_message=existing, assistant_message=_reply_to(existing), created=False
                )
        if _reply_active_else_sweep(locked.pk):
            return None
        now = timezone.now()
        user_message = ChatMessage.objects.create(
            session=locked,
            role=MessageRole.USER,
            content=content,
            client_id=client_id,
            created_at=now,
        )
        assistant = ChatMessage.objects.create(
            session=locked,
            role=MessageRole.ASSISTANT,
            content="",
            status=MessageStatus.STREAMING,
            metadata={"reply_to": user_message.pk},
            created_at=now,
        )
        ChatSession.objects.filter(pk=locked.pk).update(
            message_count=F("message_count") + 2, last_activity_at=now
        )
        event_publish_on_commit(
            session_id=locked.pk,
            event={"type": "message", "message": message_payload(user_message)},
        )
        return TurnStart(user_message=user_message, assistant_message=assistant, created=True)


def reply_restart(*, session: ChatSession, assistant_message: ChatMessage) -> ChatMessage:
    """Regenerate / retry: the reply row goes back to `streaming` with empty content."""
    with transaction.atomic():
        ChatSession.objects.select_for_update().get(pk=session.pk)
        if _reply_active(session.pk):
            raise ApiError(
                "Another reply is still being generated in this session.",
                code="reply_in_progress",
                status_code=409,
            )
        assistant_message.content = ""
        assistant_message.status = MessageStatus.STREAMING
        assistant_message.metadata = {
            k: v for k, v in assistant_message.metadata.items() if k not in ("error",)
        }
        assistant_message.save(update_fields=["content", "status", "metadata", "updated_at"])
    return assistant_message


def reply_progress(*, message_id: int, content: str) -> None:
    """Save the reply as it grows (called in batches, not per token). Bumps updated_at, which is
    also the liveness signal that keeps the row from being swept as stale."""
    ChatMessage.objects.filter(pk=message_id, status=MessageStatus.STREAMING).update(
        content=content, updated_at=timezone.now()
    )


def reply_progress_many(*, updates: dict[int, str]) -> None:
    """Save several growing replies in one transaction: one connection, one commit and one
    prepared statement per batch however many replies are streaming. Each save is a plain
    parametrised UPDATE run by `executemany`: building 200 ORM querysets per batch held the GIL
    for tens of milliseconds while the event loop waited to forward the next tokens
    (bench/realtime.py). Rows no longer `streaming` are left alone, so a batch that lands after a
    reply's final write changes nothing."""
    if not updates:
        return
    meta, qn = ChatMessage._meta, connection.ops.quote_name
    # Identifiers come from the model and are quoted; every value is a parameter.
    table, content_col, updated_col, id_col, status_col = (
        qn(meta.db_table),
        qn(meta.get_field("content").column),
        qn(meta.get_field("updated_at").column),
        qn(meta.pk.column),
        qn(meta.get_field("status").column),
    )
    sql = (
        f"UPDATE {table} SET {content_col} = %s, {updated_col} = %s "  # noqa: S608
        f"WHERE {id_col} = %s AND {status_col} = %s"
    )
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    rows = [
        (content, now, message_id, str(MessageStatus.STREAMING))
        for message_id, content in updates.items()
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def reply_finish(
    *,
    message_id: int,
    content: str,
    status: str,
    metadata: dict[str, Any] | None = None,
) -> ChatMessage:
    with transaction.atomic():
        message = ChatMessage.objects.select_for_update().get(pk=message_id)
        message.content = content
        message.status = status
        if metadata:
            message.metadata = {**message.metadata, **metadata}
        message.save(update_fields=["content", "status", "metadata", "updated_at"])
        ChatSession.objects.filter(pk=message.session_id).update(last_activity_at=timezone.now())
    return message


@dataclass(slots=True)
class ReplyCompleted:
    message: ChatMessage
    # The session row still has the context version and agent that `message.session` (as
    # locked by turn_start) has: no compaction, rewind or agent edit since the turn started,
    # so what was read from it then still holds (context_state_appended).
    context_unchanged: bool


def reply_complete(
    *, message: ChatMessage, content: str, metadata: dict[str, Any]
) -> ReplyCompleted | None:
    """The final write of a reply that ran to its end, from the row as this process holds it
    since `turn_start`: one UPDATE guarded by `status = streaming` instead of reply_finish's
    transaction, locked read and write, then the session's `last_activity_at`, guarded by its
    context version and agent so the caller learns for free whether its context moved (at the
    end of 200 replies at once, each query is GIL time the other replies' last tokens wait
    for, bench/realtime.py). Only the generation writes a streaming row's metadata, so merging
    into the copy held here loses nothing. Returns None, writing nothing, when the row is no
    longer streaming (swept or cancelled meanwhile): the caller then uses reply_finish."""
    now = timezone.now()
    merged = {**message.metadata, **metadata}
    written = ChatMessage.objects.filter(pk=message.pk, status=MessageStatus.STREAMING).update(
        content=content, status=MessageStatus.COMPLETE, metadata=merged, updated_at=now
    )
    if not written:
        return None
    session = message.session
    same = ChatSession.objects.filter(pk=session.pk, context_version=session.context_version)
    if session.agent is None:
        same = same.filter(agent__isnull=True)
    else:
        same = same.filter(agent_id=session.agent.pk, agent__updated_at=session.agent.updated_at)
    unchanged = same.update(last_activity_at=now) == 1
    if not unchanged:
        ChatSession.objects.filter(pk=session.pk).update(last_activity_at=now)
    message.content, message.status, message.metadata = content, MessageStatus.COMPLETE, merged
    message.updated_at = now
    return ReplyCompleted(message=message, context_unchanged=unchanged)


def tool_message_create(
    *, session_id: int, role: str, content: str, tool_calls: Any = None, tool_call_id: str = ""
) -> ChatMessage:
    """Tool-loop rounds are stored as ordinary messages (assistant with tool_calls, tool)."""
    with transaction.atomic():
        message = ChatMessage.objects.create(
            session_id=session_id,
            role=role,
            content=content,
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
        )
        ChatSession.objects.filter(pk=session_id).update(
            message_count=F("message_count") + 1, last_activity_at=timezone.now()
        )
    return message


def streaming_sweep(
    *, older_than_seconds: int = STALE_STREAMING_SECONDS, session_id: int | None = None
) -> int:
    """Mark replies left `streaming` by a dead process as failed, so nothing stays stuck. Runs
    at start-up for every session, and for one session whenever a send finds it idle: a live
    reply saves progress (updated_at) at least every SAVE_EVERY_SECONDS while tokens flow, so a
    row silent this long belongs to no running process, in this one or any other."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    stale = ChatMessage.objects.filter(status=MessageStatus.STREAMING, updated_at__lt=cutoff)
    if session_id is not None:
        stale = stale.filter(session_id=session_id)
    count = 0
    for message in stale.only("id", "metadata"):
        _mark_interrupted(message)
        count += 1
    return count
