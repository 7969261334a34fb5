"""Storing a turn: the user message and its reply row, `streaming` (the reply row's life from
there on is chat/turn/replies.py).

A turn starts under the session row lock, so idempotency on `client_id`, "one reply at a time"
and the denormalised counters are decided by one writer at a time, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from chat.context import ContextState, Payload, SendCompaction, SystemPrompt
from chat.errors import NotFound
from chat.events import ORIGIN, event_publish_on_commit
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.queries import message_insert, message_rows
from chat.shapes import message_event, message_payload
from chat.turn.checks import SendRequest, send_checked
from chat.turn.replies import reply_busy_check


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
    # The send's key among this process's sends on their way to their first token
    # (chat/workers.py foreground_enter): its reply exits it at its first token.
    foreground: object | None = None


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


# The stamp, and whether any of the owner's replies is streaming (chat_msg_streaming_idx, the
# partial index of the few streaming rows, answers it). The owner's sessions whatever the cap:
# without one the busy check only reads this session's rows, and an owner's reply streaming
# elsewhere merely costs that read.
_STAMP = (
    "UPDATE chat_sessions SET message_count = message_count + 2, last_activity_at = %s "
    "WHERE id = %s RETURNING EXISTS(SELECT 1 FROM chat_messages m WHERE m.status = 'streaming' "
    "AND m.session_id IN (SELECT s.id FROM chat_sessions s WHERE s.owner_id = %s))"
)


def _stamp_and_lock(*, session: ChatSession, now: Any) -> bool | None:
    """Stamp the session list (two messages more, the last activity) with the UPDATE that takes
    the session's lock, and say in the same statement whether a reply of the owner is
    streaming: when none is, as on almost every send, reply_busy_check's read is
    skipped, one round trip fewer before the first token. None when the session is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            _STAMP, [connection.ops.adapt_datetimefield_value(now), session.pk, session.owner_id]
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


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
        streaming_seen = _stamp_and_lock(session=locked, now=now)
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
        if streaming_seen:
            reply_busy_check(session=locked)
        if abandoned is not None and abandoned():
            # Asked again here, under the lock, once the session is free: the queue asked
            # before this trip, and a login that ended while the trip waited for a thread
            # (and the reply it queued behind ended) would otherwise still store the send.
            raise NotFound()
        # message_insert: the ORM's INSERT without compiling it again (chat/queries.py).
        user_message = message_insert(
            ChatMessage(
                session=locked,
                role=MessageRole.USER,
                content=content,
                client_id=client_id,
                created_at=now,
            )
        )
        reply = message_insert(
            ChatMessage(
                session=locked,
                role=MessageRole.ASSISTANT,
                content="",
                status=MessageStatus.STREAMING,
                # Whose lease says whether it is still being generated (chat/turn/lease.py).
                generator=ORIGIN,
                metadata={"reply_to": user_message.pk},
                created_at=now,
            )
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
