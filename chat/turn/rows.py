"""The rows of a turn: the user message and the reply row(s), from storing them to their final
write, and the sweep that fails replies a dead process left `streaming`.

A turn starts under the session row lock, so idempotency on `client_id`, "one reply at a time"
and the denormalised counters are decided by one writer at a time, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chat.context import ContextState, Payload, SendCompaction, SystemPrompt
from chat.errors import NotFound, ReplyInProgress, TooManyReplies
from chat.events import event_publish_on_commit
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.queries import message_rows
from chat.search.backends import search_index_tidy
from chat.shapes import message_event, message_payload
from chat.turn.checks import SendRequest, send_checked

# A reply row still `streaming` with no progress saved for this long belongs to a dead process.
STALE_STREAMING_SECONDS = 120
# What a refusal for too many replies at once suggests: a reply takes seconds.
REPLY_SLOT_RETRY_SECONDS = 5


@dataclass(slots=True, kw_only=True)
class Prepared:
    """Everything a reply needs from the database before its model call (chat/turn/generate.py,
    `turn_prepare`)."""

    # What the turn-started hooks announced (a fact remembered).
    events: list[dict[str, Any]]
    state: ContextState
    # "now": compact before the call; the payload is then built after it, not here.
    compaction: SendCompaction
    payload: Payload | None = None
    too_large: str = ""  # why no payload can fit (PayloadTooLarge)


@dataclass(slots=True, kw_only=True)
class Turn:
    """A user message and the reply row generated for it: what every adapter hands to the
    generation, whichever way the turn began (a send, a regenerate)."""

    # The session as read when the turn began, with its agent: the context of the reply is
    # read from it, and the reply's final write checks that it has not moved since.
    session: ChatSession
    user_message: ChatMessage | None
    # The assistant row: `streaming` for a new turn; for a repeat, whatever the first send left.
    reply: ChatMessage | None
    query: str
    # False when client_id matched an earlier send: nothing new was stored.
    created: bool = True
    # The system prompt as the send's checks loaded it (None: load it when preparing).
    prompt: SystemPrompt | None = None
    # Prepared in the same trip to the database as the store, when the adapter had it done.
    prepared: Prepared | None = None


def reply_for(*, user_message: ChatMessage) -> ChatMessage | None:
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


def _fresh_since() -> Any:
    return timezone.now() - timedelta(seconds=STALE_STREAMING_SECONDS)


def _reply_active_else_sweep(session: ChatSession) -> bool:
    """Is a reply of the session live? When none is, fail the session's stale `streaming` rows
    (a reply orphaned by a crash shortly before the last restart escapes the start-up sweep,
    and the session's next send finishes it off), and check the owner's replies generating in
    their other sessions against CHAT_MAX_CONCURRENT_REPLIES (TooManyReplies). One read of the
    partial index chat_msg_streaming_idx, which holds only the few streaming rows, for all
    three."""
    cap = settings.CHAT_MAX_CONCURRENT_REPLIES
    streaming = ChatMessage.objects.filter(status=MessageStatus.STREAMING)
    # Without a cap only this session's rows matter: a user with hundreds of replies going
    # (a benchmark) would make every send read all of them.
    streaming = (
        streaming.filter(session__owner_id=session.owner_id)
        if cap
        else streaming.filter(session_id=session.pk)
    )
    rows = list(streaming.only("id", "session_id", "updated_at", "metadata"))
    fresh_since = _fresh_since()
    own = [row for row in rows if row.session_id == session.pk]
    if any(row.updated_at >= fresh_since for row in own):
        return True
    for row in own:
        _mark_interrupted(row)
    elsewhere = sum(
        1 for row in rows if row.session_id != session.pk and row.updated_at >= fresh_since
    )
    if cap and elsewhere >= cap:
        raise _too_many(elsewhere=elsewhere, cap=cap)
    return False


# The stamp, and whether any of the owner's replies is streaming (chat_msg_streaming_idx, the
# partial index of the few streaming rows, answers it). The owner's sessions whatever the cap:
# without one the busy check only reads this session's rows, and an owner's reply streaming
# elsewhere merely costs that read.
_STAMP = (
    "UPDATE chat_sessions SET message_count = message_count + 2, last_activity_at = %s "
    "WHERE id = %s RETURNING EXISTS(SELECT 1 FROM chat_messages m WHERE m.status = 'streaming' "
    "AND m.session_id IN (SELECT s.id FROM chat_sessions s WHERE s.owner_id = %s))"
)


def _stamped(*, session: ChatSession, now: Any) -> bool | None:
    """Stamp the session list (two messages more, the last activity) with the UPDATE that takes
    the session's lock, and say in the same statement whether a reply of the owner is
    streaming: when none is, as on almost every send, _reply_active_else_sweep's read is
    skipped, one round trip fewer before the first token. None when the session is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            _STAMP, [connection.ops.adapt_datetimefield_value(now), session.pk, session.owner_id]
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def _too_many(*, elsewhere: int, cap: int) -> TooManyReplies:
    return TooManyReplies(
        f"{elsewhere} of your replies are being generated in other chats; this server "
        f"allows {cap} at once. Try again when one finishes.",
        retry_after=REPLY_SLOT_RETRY_SECONDS,
    )


def _mark_interrupted(message: ChatMessage) -> None:
    message.status = MessageStatus.FAILED
    message.metadata = {**message.metadata, "error": "interrupted: the server stopped"}
    message.save(update_fields=["status", "metadata", "updated_at"])


def _busy() -> ReplyInProgress:
    return ReplyInProgress(
        "Another reply is still being generated in this session; try again when it finishes, "
        "or cancel it."
    )


def turn_store(*, send: SendRequest, abandoned: Callable[[], bool] | None = None) -> Turn:
    """Check the send and store the user message and an empty `streaming` reply row in one
    transaction, or, for a client_id seen before, return what the first send stored (`created`
    False). Raises the checks' errors, ReplyInProgress while another reply of the session
    is generating (the caller queues), and NotFound when `abandoned` says the send was given
    up (chat/turn/service.py turn_queue)."""
    checked = send_checked(send=send)
    locked, content, client_id = checked.session, checked.content, checked.client_id
    now = timezone.now()
    with transaction.atomic():
        # The lock serialises the session's sends: idempotency, one reply at a time and the
        # counters are decided by one writer at a time. The row itself is the one the checks
        # read a moment ago: if a compaction moved the summary since, the reply is built on
        # the state just before (consistent), and its final write sees the move.
        # The UPDATE that stamps the session list (the counter, the last activity) is what
        # takes the lock, as SELECT ... FOR UPDATE would: one statement fewer before the first
        # token (bench ttft). A send that stores nothing rolls it back.
        streaming_seen = _stamped(session=locked, now=now)
        if streaming_seen is None:
            raise NotFound()
        if client_id is not None:
            existing = ChatMessage.objects.filter(session=locked, client_id=client_id).first()
            if existing is not None:
                repeat = Turn(
                    session=locked,
                    user_message=existing,
                    reply=reply_for(user_message=existing),
                    query=existing.content,
                    created=False,
                )
                transaction.set_rollback(True)  # a repeat stores nothing: the stamp is undone
                return repeat
        if streaming_seen and _reply_active_else_sweep(locked):
            raise _busy()
        if abandoned is not None and abandoned():
            # Asked again here, under the lock, once the session is free: the queue asked
            # before this trip, and a login that ended while the trip waited for a thread
            # (and the reply it queued behind ended) would otherwise still store the send.
            raise NotFound()
        user_message = ChatMessage.objects.create(
            session=locked,
            role=MessageRole.USER,
            content=content,
            client_id=client_id,
            created_at=now,
        )
        reply = ChatMessage.objects.create(
            session=locked,
            role=MessageRole.ASSISTANT,
            content="",
            status=MessageStatus.STREAMING,
            metadata={"reply_to": user_message.pk},
            created_at=now,
        )
        event_publish_on_commit(
            session_id=locked.pk,
            event=message_event(message=message_payload(user_message)),
        )
        return Turn(
            session=locked,
            user_message=user_message,
            reply=reply,
            query=content,
            prompt=checked.prompt,
        )


def reply_restart(*, session: ChatSession, reply: ChatMessage) -> ChatMessage:
    """Regenerate / retry: the reply row goes back to `streaming` with empty content."""
    with transaction.atomic():
        ChatSession.objects.select_for_update().get(pk=session.pk)
        if ChatMessage.objects.filter(
            session_id=session.pk, status=MessageStatus.STREAMING, updated_at__gte=_fresh_since()
        ).exists():
            raise _busy()
        # A regenerate starts a reply like a send does: it counts against the same cap (it
        # went around it, and a user could run any number of replies at once).
        cap = settings.CHAT_MAX_CONCURRENT_REPLIES
        if cap:
            elsewhere = (
                ChatMessage.objects.filter(
                    status=MessageStatus.STREAMING,
                    session__owner_id=session.owner_id,
                    updated_at__gte=_fresh_since(),
                )
                .exclude(session_id=session.pk)
                .count()
            )
            if elsewhere >= cap:
                raise _too_many(elsewhere=elsewhere, cap=cap)
        reply.content = ""
        reply.status = MessageStatus.STREAMING
        reply.metadata = {k: v for k, v in reply.metadata.items() if k != "error"}
        reply.save(update_fields=["content", "status", "metadata", "updated_at"])
    return reply


def reply_progress(*, message_id: int, content: str) -> None:
    """Save one growing reply (a cancelled stream's last words)."""
    reply_progress_many(updates={message_id: content})


def reply_progress_many(*, updates: dict[int, str]) -> None:
    """Save growing replies, all in one transaction: one connection, one commit and one prepared
    statement per batch however many replies are streaming. Each save is a plain parametrised
    UPDATE run by `executemany`: building 200 ORM querysets per batch held the GIL for tens of
    milliseconds while the event loop waited to forward the next tokens. Rows no longer
    `streaming` are left alone, so a batch that lands after a reply's final write changes
    nothing. Bumps updated_at, the liveness signal that keeps a row from being swept."""
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


@dataclass(slots=True)
class ReplyFinished:
    message: ChatMessage
    # The session still had the context version and agent `session` was read with: nothing
    # (compaction, rewind, agent edit) moved the context during the reply, so what was read
    # then still holds (chat.context.context_state_after_reply).
    context_unchanged: bool


def reply_finish(
    *,
    message: ChatMessage,
    session: ChatSession,
    content: str,
    status: str,
    metadata: dict[str, Any] | None = None,
) -> ReplyFinished:
    """The final write of a reply row, and the session's `last_activity_at`.

    A reply that completed is written with one UPDATE guarded by `status = streaming`, from the
    row as this process holds it (only the generation writes a streaming row's metadata, so
    merging into the copy held here loses nothing), and the stamp is guarded by the context
    version and agent `session` was read with, so the caller learns for free whether its
    context moved: at the end of 200 replies at once each query is GIL time the other replies'
    last tokens wait for. A row no longer streaming (swept, cancelled meanwhile), or a reply
    that did not complete, takes the locked read-and-write instead.
    Then the search index is tidied (search_index_tidy), as no one waits on a reply's end."""
    now = timezone.now()
    if status == MessageStatus.COMPLETE:
        merged = {**message.metadata, **(metadata or {})}
        written = ChatMessage.objects.filter(pk=message.pk, status=MessageStatus.STREAMING).update(
            content=content, status=status, metadata=merged, updated_at=now
        )
        if written:
            same = ChatSession.objects.filter(
                pk=session.pk, context_version=session.context_version
            )
            if session.agent is None:
                same = same.filter(agent__isnull=True)
            else:
                same = same.filter(
                    agent_id=session.agent.pk, agent__updated_at=session.agent.updated_at
                )
            unchanged = same.update(last_activity_at=now) == 1
            if not unchanged:
                ChatSession.objects.filter(pk=session.pk).update(last_activity_at=now)
            message.content, message.status, message.metadata = content, status, merged
            message.updated_at = now
            search_index_tidy()
            return ReplyFinished(message=message, context_unchanged=unchanged)
    with transaction.atomic():
        row = ChatMessage.objects.select_for_update().get(pk=message.pk)
        row.content = content
        row.status = status
        if metadata:
            row.metadata = {**row.metadata, **metadata}
        row.save(update_fields=["content", "status", "metadata", "updated_at"])
        ChatSession.objects.filter(pk=row.session_id).update(last_activity_at=timezone.now())
    search_index_tidy()
    return ReplyFinished(message=row, context_unchanged=False)


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
