"""How a reply that does not complete ends (chat/turn/generate.py): stored `failed` with what
the user may read, or `cancelled`; its streams always get `done`, never silence. A reply whose
session was deleted under it (chat/turn/truncate.py `turn_session_delete`, when the reply did
not stop in time) just ends: there is nothing left to store, nobody to tell "try again"."""

from __future__ import annotations

import asyncio
import logging

from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.shapes import done_event, error_event, message_payload
from chat.turn.finish import ReplyResult, reply_result_cancelled, reply_result_failed
from chat.turn.registry import Generation
from chat.turn.rows import Turn
from chat.workers import in_worker

logger = logging.getLogger("chat.reply")

# Attempts at storing a reply failed by an unexpected error, and the waits between them: a
# database restart takes a few seconds, and the streams wait for the stored row meanwhile.
UNEXPECTED_STORE_WAITS = (0.0, 0.5, 1.0, 2.0, 4.0)

# What a user is told when a reply fails. The model server's own words (its error body, a
# host and port in a connection error) go to the log and to staff (metadata `error_detail`).
FAILURE_MESSAGES = {
    "llm_error": "The model could not answer; try again in a moment.",
    "llm_stream_cut": "The model's answer was cut off; what arrived is kept.",
    "context_too_large": "This conversation is too large for the model, even compacted.",
    "llm_empty_reply": "The model answered with nothing; try again in a moment.",
    "server_error": "The server failed while finishing this reply; try again.",
}


def done_publish(gen: Generation, result: ReplyResult) -> None:
    gen.finished = result
    gen.publish(
        done_event(message=message_payload(result.message), context_budget=result.context_budget)
    )


async def reply_fail(
    gen: Generation,
    turn: Turn,
    reply: ChatMessage,
    partial: str,
    code: str,
    error: str,
    *,
    shown: str | None = None,
) -> ReplyResult:
    """`shown`: what the user may read, when the error is our own words (else the generic
    text of the code)."""
    logger.warning(
        "chat_reply_failed session=%s message=%s code=%s error=%s",
        gen.session_id,
        reply.pk,
        code,
        error,
    )
    message = shown or FAILURE_MESSAGES[code]
    result = await in_worker(reply_result_failed)(
        turn=turn,
        reply=reply,
        content=partial,
        status=MessageStatus.FAILED,
        metadata={"error": message, "error_code": code, "error_detail": error[:2000]},
    )
    gen.publish(error_event(code=code, message=message))
    done_publish(gen, result)
    return result


async def reply_fail_unexpected(
    gen: Generation, turn: Turn, reply: ChatMessage, exc: Exception
) -> ReplyResult:
    """The reply failed on something other than the model: stored `failed` with the text that
    arrived (retried while the database comes back). When it cannot be stored, `done` carries
    the row as it would have been stored; the row itself is left to the sweep."""
    partial = "".join(gen.parts.get(reply.pk, ()))
    if await _session_deleted(session_id=gen.session_id):
        gone = _deleted(gen, reply, partial)
        done_publish(gen, gone)
        return gone
    logger.error("chat_reply_failed_unexpectedly session=%s", gen.session_id, exc_info=exc)
    code, message = "server_error", FAILURE_MESSAGES["server_error"]
    gen.publish(error_event(code=code, message=message))
    metadata = {"error": message, "error_code": code, "error_detail": repr(exc)[:2000]}
    for wait in UNEXPECTED_STORE_WAITS:
        await asyncio.sleep(wait)
        try:
            result: ReplyResult = await in_worker(reply_result_failed)(
                turn=turn,
                reply=reply,
                content=partial,
                status=MessageStatus.FAILED,
                metadata=metadata,
            )
            break
        except Exception:
            logger.warning("chat_reply_fail_store_retry session=%s", gen.session_id, exc_info=True)
    else:
        reply.content, reply.status = partial, MessageStatus.FAILED
        reply.metadata = {**reply.metadata, **metadata}
        result = ReplyResult(message=reply, context_budget=None)
    done_publish(gen, result)
    return result


async def reply_cancelled_store(gen: Generation, turn: Turn, reply: ChatMessage) -> ReplyResult:
    """A cancelled reply's partial, stored `cancelled`; as it would have been stored when its
    session was deleted meanwhile."""
    try:
        result: ReplyResult = await in_worker(reply_result_cancelled)(turn=turn, reply=reply)
    except Exception:
        if not await _session_deleted(session_id=gen.session_id):
            raise
        return _deleted(gen, reply, "".join(gen.parts.get(reply.pk, ())))
    return result


def _deleted(gen: Generation, reply: ChatMessage, partial: str) -> ReplyResult:
    logger.info("chat_reply_session_deleted session=%s", gen.session_id)
    reply.content, reply.status = partial, MessageStatus.CANCELLED
    return ReplyResult(message=reply, context_budget=None)


async def _session_deleted(*, session_id: int) -> bool:
    """Whether the reply's session is gone (deleted under it), asked after the reply's own
    write failed; False when that cannot be told (a database that is down)."""
    try:
        exists: bool = await in_worker(ChatSession.objects.filter(pk=session_id).exists)()
    except Exception:
        return False
    return not exists
