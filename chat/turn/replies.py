"""The reply row's life, and the one rule for whether a reply is live (chat.models
reply_live_since). A reply row is created `streaming` with its turn (chat/turn/rows.py) or a
tool round (reply_round_next), and then:

    streaming --progress--> streaming     reply_progress(_many): text so far, and liveness
    streaming --finish----> complete      reply_finish
              --fail------> failed        reply_finish (the model failed), streaming_sweep and
                                          reply_busy_check (its process died)
              --cancel----> cancelled     reply_cancel_store
    final     --restart---> streaming     reply_restart (regenerate, retry)

Only `streaming` rows are written by the generation; a final row is never written again except
by a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chat.context import context_budget_from_db
from chat.errors import NotFound, NotLastReply, ReplyInProgress, TooManyReplies
from chat.events import ORIGIN, event_publish_now
from chat.models import (
    STALE_STREAMING_SECONDS,
    ChatMessage,
    ChatSession,
    GeneratorLease,
    MessageRole,
    MessageStatus,
    reply_live_since,
)
from chat.search.backends import search_index_tidy
from chat.shapes import done_event, error_event, message_payload

logger = logging.getLogger("chat.reply")

# What a refusal for too many replies at once suggests: a reply takes seconds.
REPLY_SLOT_RETRY_SECONDS = 5


def reply_busy_check(*, session: ChatSession) -> None:
    """ReplyInProgress while a reply of the session is live. When none is, fail the session's
    stale `streaming` rows (a reply orphaned by a crash shortly before the last restart
    escapes the start-up sweep, and the session's next send finishes it off), and check the
    owner's replies generating in their other sessions against CHAT_MAX_CONCURRENT_REPLIES
    (TooManyReplies). One read of the partial index chat_msg_streaming_idx, which holds only
    the few streaming rows, for all three."""
    cap = settings.CHAT_MAX_CONCURRENT_REPLIES
    streaming = ChatMessage.objects.filter(status=MessageStatus.STREAMING)
    # Without a cap only this session's rows matter: a user with hundreds of replies going
    # (a benchmark) would make every send read all of them.
    streaming = (
        streaming.filter(session__owner_id=session.owner_id)
        if cap
        else streaming.filter(session_id=session.pk)
    )
    rows = list(streaming.only("id", "session_id", "updated_at", "metadata", "generator"))
    live = _live_rule(rows)
    own = [row for row in rows if row.session_id == session.pk]
    if any(live(row) for row in own):
        raise _busy()
    for row in own:
        _reply_mark_interrupted(row)
    elsewhere = sum(1 for row in rows if row.session_id != session.pk and live(row))
    if cap and elsewhere >= cap:
        raise _too_many(elsewhere=elsewhere, cap=cap)


def _too_many(*, elsewhere: int, cap: int) -> TooManyReplies:
    return TooManyReplies(
        f"{elsewhere} of your replies are being generated in other chats; this server "
        f"allows {cap} at once. Try again when one finishes.",
        retry_after=REPLY_SLOT_RETRY_SECONDS,
    )


def _live_rule(rows: list[ChatMessage]) -> Callable[[ChatMessage], bool]:
    """reply_live_since's rule and reply_orphaned's, applied to rows read once for all the
    busy check's questions. The leases are read only when a row has been quiet for a lease,
    which a live reply's progress saves rarely allow."""
    fresh_since = reply_live_since()
    quiet_since = reply_live_since(seconds=settings.CHAT_REPLY_LEASE_SECONDS)
    quiet = {row.generator for row in rows if row.generator and row.updated_at < quiet_since}
    expired = (
        set(
            GeneratorLease.objects.filter(
                process__in=quiet, expires_at__lt=timezone.now()
            ).values_list("process", flat=True)
        )
        if quiet
        else set()
    )

    def live(row: ChatMessage) -> bool:
        if row.updated_at < fresh_since:
            return False
        return not (row.updated_at < quiet_since and row.generator in expired)

    return live


# What a reply whose process died is stored with and what its sockets are told.
INTERRUPTED_ERROR = "interrupted: the server stopped"
INTERRUPTED_SHOWN = "The server generating this reply stopped; what arrived is kept."


def _reply_mark_interrupted(message: ChatMessage) -> None:
    """Fail a reply orphaned by its process (its text is the last progress save), guarded by
    `streaming`, and tell the session's sockets in every process, after commit: `error`, then
    `done` with the stored row."""
    metadata = {**message.metadata, "error": INTERRUPTED_ERROR, "error_code": "interrupted"}
    written = ChatMessage.objects.filter(pk=message.pk, status=MessageStatus.STREAMING).update(
        status=MessageStatus.FAILED, metadata=metadata, updated_at=timezone.now()
    )
    if written:
        transaction.on_commit(lambda: _interrupted_announce(message_id=message.pk))


def _interrupted_announce(*, message_id: int) -> None:
    message = ChatMessage.objects.filter(pk=message_id).first()
    if message is None:
        return
    try:
        budget: dict[str, Any] | None = context_budget_from_db(session_id=message.session_id)
    except Exception:  # the budget is a nicety; the end of the reply is not
        logger.exception("chat_interrupted_budget_failed message=%s", message_id)
        budget = None
    session_id = message.session_id
    event_publish_now(
        session_id=session_id, event=error_event(code="interrupted", message=INTERRUPTED_SHOWN)
    )
    event_publish_now(
        session_id=session_id,
        event=done_event(message=message_payload(message), context_budget=budget),
    )


def _busy() -> ReplyInProgress:
    return ReplyInProgress(
        "Another reply is still being generated in this session; try again when it finishes, "
        "or cancel it."
    )


def reply_restart(*, session: ChatSession, reply: ChatMessage) -> ChatMessage:
    """Regenerate / retry: the reply row goes back to `streaming` with empty content."""
    with transaction.atomic():
        # Deleted since the caller read it: a 404, as for any session that is not there.
        if ChatSession.objects.select_for_update().filter(pk=session.pk).first() is None:
            raise NotFound()
        messages = ChatMessage.objects.filter(session_id=session.pk)
        if messages.replies_live().exists():
            raise _busy()
        # Asked again under the lock: a truncation since the caller picked the reply deleted it
        # (its save then changed no row: a 500), or a send put a newer message after it.
        if messages.order_by("-id").values_list("id", flat=True).first() != reply.pk:
            raise NotLastReply("Only the last reply of a session can be regenerated.")
        # A regenerate starts a reply like a send does: it counts against the same cap (it
        # went around it, and a user could run any number of replies at once).
        cap = settings.CHAT_MAX_CONCURRENT_REPLIES
        if cap:
            elsewhere = (
                ChatMessage.objects.filter(session__owner_id=session.owner_id)
                .replies_live()
                .exclude(session_id=session.pk)
                .count()
            )
            if elsewhere >= cap:
                raise _too_many(elsewhere=elsewhere, cap=cap)
        reply.content = ""
        reply.status = MessageStatus.STREAMING
        reply.generator = ORIGIN
        reply.metadata = {
            k: v for k, v in reply.metadata.items() if k not in ("error", "error_code")
        }
        reply.save(update_fields=["content", "status", "generator", "metadata", "updated_at"])
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
        # One transaction: a connection lost between the two writes (a database restart) left
        # a complete reply in a session whose stamp never moved, and the caller, seeing an
        # error, could not tell what was stored. No savepoint: nothing calls this inside a
        # transaction but tests, where one would add two statements to count.
        with transaction.atomic(savepoint=False):
            written = ChatMessage.objects.filter(
                pk=message.pk, status=MessageStatus.STREAMING
            ).update(content=content, status=status, metadata=merged, updated_at=now)
            unchanged = bool(written) and _session_stamp(session=session, now=now)
        if written:
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


def _session_stamp(*, session: ChatSession, now: Any) -> bool:
    """Stamp the session's last activity; True when its context version and agent are still
    the ones `session` was read with."""
    same = ChatSession.objects.filter(pk=session.pk, context_version=session.context_version)
    if session.agent is None:
        same = same.filter(agent__isnull=True)
    else:
        same = same.filter(agent_id=session.agent.pk, agent__updated_at=session.agent.updated_at)
    unchanged = same.update(last_activity_at=now) == 1
    if not unchanged:
        ChatSession.objects.filter(pk=session.pk).update(last_activity_at=now)
    return unchanged


def streaming_sweep(
    *, older_than_seconds: int = STALE_STREAMING_SECONDS, session_id: int | None = None
) -> int:
    """Mark replies left `streaming` by a dead process as failed, so nothing stays stuck. Runs
    at start-up for every session, and for one session whenever a send finds it idle: a live
    reply saves progress (updated_at) at least every SAVE_EVERY_SECONDS while tokens flow, so a
    row silent this long belongs to no running process, in this one or any other."""
    stale = ChatMessage.objects.replies_stale(seconds=older_than_seconds)
    if session_id is not None:
        stale = stale.filter(session_id=session_id)
    count = 0
    for message in stale.only("id", "metadata"):
        _reply_mark_interrupted(message)
        count += 1
    return count


def reply_cancel_store(*, reply: ChatMessage, session: ChatSession) -> ChatMessage:
    """A cancelled reply keeps the text it had (its last progress save), unless something else
    (the tool loop's own cancel, a sweep) finished the row meanwhile."""
    current = ChatMessage.objects.get(pk=reply.pk)
    if current.status != MessageStatus.STREAMING:
        return current
    return reply_finish(
        message=current, session=session, content=current.content, status=MessageStatus.CANCELLED
    ).message


# --- the rows of the agent's tool rounds (chat/turn/toolloop.py) -----------------------------


CANCELLED_RESULT = "Error: cancelled before this tool ran."


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
        ChatSession.objects.filter(pk=session_id).counters_add(messages=1, at=timezone.now())
    return message


def reply_tool_calls_set(
    *, message_id: int, content: str, tool_calls: list[dict[str, Any]]
) -> ChatMessage:
    """The row being written asks for tools: store its text and calls. It stays `streaming`
    until its tools have run (see the module docstring)."""
    with transaction.atomic():
        message = ChatMessage.objects.select_for_update().get(pk=message_id)
        message.content = content
        message.tool_calls = tool_calls
        message.save(update_fields=["content", "tool_calls", "updated_at"])
    return message


def reply_round_next(
    *, message_id: int, session_id: int, reply_to: int | None, tool_round: int
) -> tuple[ChatMessage, ChatMessage]:
    """Complete the tool-call row and open the next round's `streaming` row, atomically, so the
    session never looks idle between two rounds. Returns (completed, new)."""
    now = timezone.now()
    with transaction.atomic():
        done = ChatMessage.objects.select_for_update().get(pk=message_id)
        done.status = MessageStatus.COMPLETE
        done.metadata = {**done.metadata, "tool_round": tool_round}
        done.save(update_fields=["status", "metadata", "updated_at"])
        new = ChatMessage.objects.create(
            session_id=session_id,
            role=MessageRole.ASSISTANT,
            content="",
            status=MessageStatus.STREAMING,
            generator=ORIGIN,
            metadata={"reply_to": reply_to, "tool_round": tool_round + 1},
            created_at=now,
        )
        ChatSession.objects.filter(pk=session_id).counters_add(messages=1, at=now)
    return done, new


def reply_round_cancel(
    *, message_id: int, session_id: int, missing_call_ids: Sequence[str]
) -> None:
    """Cancelled between a tool call and its results: give every unanswered call a result (a
    provider rejects a call without one in later payloads) and mark the row cancelled."""
    for call_id in missing_call_ids:
        tool_message_create(
            session_id=session_id,
            role=MessageRole.TOOL,
            content=CANCELLED_RESULT,
            tool_call_id=call_id,
        )
    ChatMessage.objects.filter(pk=message_id, status=MessageStatus.STREAMING).update(
        status=MessageStatus.CANCELLED, updated_at=timezone.now()
    )
