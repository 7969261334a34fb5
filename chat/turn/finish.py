"""The end of a reply, in worker threads: its final write and the budget `done` carries
(complete, failed, cancelled), then the after-reply work: the turn-finished hooks, a title, and
a background compaction when the next turn would cross the threshold."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError

from chat import hooks
from chat.context import (
    ContextState,
    Payload,
    Trigger,
    context_budget_from_db,
    context_budget_from_state,
    context_compaction_decide,
    context_state_after_reply,
)
from chat.llm import slots
from chat.llm.window import tokens_learn
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.search.semantic import session_embed_later
from chat.services.compaction import session_compact
from chat.services.titles import session_title_after_reply
from chat.turn.replies import reply_cancel_store, reply_finish
from chat.turn.rows import Turn
from chat.workers import background_submit

logger = logging.getLogger("chat.reply")


@dataclass(slots=True, frozen=True)
class ReplyResult:
    message: ChatMessage
    # The session's budget once the reply is stored (what `done` carried).
    context_budget: dict[str, Any] | None


def tokens_learn_from_usage(
    *, state: ContextState, payload: Payload, finish: dict[str, Any], model: str
) -> None:
    """Teach the token estimate this model's tokenizer from the prompt it just read, where a
    window is in force (only then do tokens bound the payload; elsewhere the estimate would be
    work for nothing)."""
    usage = finish.get("usage") or {}
    reported = usage.get("prompt_tokens")
    if not state.binding or not isinstance(reported, int):
        return
    text = "".join(str(m.get("content") or "") for m in payload.messages)
    tokens_learn(model=model, text=text, reported=reported)


def cut_marker(finish: dict[str, Any]) -> dict[str, Any]:
    """Marks a reply the model did not end itself, so the page can offer to continue it.
    "length": the model's token limit cut it. No reason at all: llama.cpp-based servers end a
    stream that way when a newer request interrupts it (docs/real-llm-notes.md)."""
    if not finish:
        return {}
    reason = finish.get("finish_reason")
    if reason == "length":
        return {"finish_reason": reason, "cut": "length"}
    if reason is None and not finish.get("tool_calls"):
        return {"finish_reason": None, "cut": "interrupted"}
    return {"finish_reason": reason}


def reply_result_complete(
    *,
    state: ContextState,
    reply: ChatMessage,
    same_row: bool,
    content: str,
    metadata: dict[str, Any],
) -> tuple[ReplyResult, ContextState]:
    """The final write of a completed reply and the `done` event's budget, in one trip to a
    worker thread, with the context the budget was computed from (`after_reply_run` decides on
    compaction from it). `state` is what the payload was built from."""
    written = reply_finish(
        message=reply,
        session=state.session,
        content=content,
        status=MessageStatus.COMPLETE,
        metadata=metadata,
    )
    after = context_state_after_reply(
        state=state, message=written.message, unchanged=written.context_unchanged and same_row
    )
    budget = context_budget_from_state(state=after)
    return ReplyResult(message=written.message, context_budget=budget), after


def reply_result_failed(
    *, turn: Turn, reply: ChatMessage, content: str, status: str, metadata: Any
) -> ReplyResult:
    """The final write of a reply that did not complete, and the budget as stored now."""
    written = reply_finish(
        message=reply, session=turn.session, content=content, status=status, metadata=metadata
    )
    budget = context_budget_from_db(session_id=turn.session.pk)
    return ReplyResult(message=written.message, context_budget=budget)


def reply_result_cancelled(*, turn: Turn, reply: ChatMessage) -> ReplyResult:
    message = reply_cancel_store(reply=reply, session=turn.session)
    return ReplyResult(
        message=message, context_budget=context_budget_from_db(session_id=message.session_id)
    )


def after_reply_run(
    *, after: ContextState, turn: Turn, reply: ChatMessage, query_runes: int
) -> None:
    """Hooks and the background-compaction decision, on the rows this reply already holds:
    `after` is the session and context as the final write's trip worked them out."""
    session = after.session
    for hook in hooks.turn_finished_hooks:
        try:
            hook(session=session, user_message=turn.user_message, assistant_message=reply)
        except Exception:
            logger.exception("chat_turn_finished_hook_failed session=%s", session.pk)
    try:
        session_title_after_reply(session=session, user_message=turn.user_message, reply=reply)
    except Exception:
        # A title is a nicety: it never fails a stored reply.
        logger.exception("chat_title_failed session=%s", session.pk)
    compact_later_if_due(after, query_runes)
    # The turn's two messages (and any a failed run left) get their vectors off this path.
    session_embed_later(session_id=session.pk)


def compact_later_if_due(state: ContextState, next_message_runes: int) -> None:
    """Compact now, in the background, if the next turn would cross the threshold: then the next
    send rarely waits for a summary."""
    # Expect the next turn to be about as long as this one's question plus its answer.
    reserve = max(next_message_runes, 200) * 2
    if context_compaction_decide(state=state, after_reply=True, reserve_runes=reserve) == "none":
        return
    background_submit(
        compact_in_background,
        session_id=state.session.pk,
        trigger="after_reply",
        reserve_runes=reserve,
    )


def compact_in_background(*, session_id: int, trigger: Trigger, reserve_runes: int = 0) -> None:
    """A compaction no one waits for. On a one-slot model server (LLM_SERVER_SLOTS=1) it lets
    the replies in flight go first: a summary sent beside a reply would delay it, or cut it off
    (chat/llm/slots.py)."""
    try:
        if settings.LLM_SERVER_SLOTS != 1:
            session_compact(session_id=session_id, trigger=trigger, reserve_runes=reserve_runes)
            return
        with slots.background(timeout=settings.LLM_IDLE_WAIT_SECONDS):
            session_compact(session_id=session_id, trigger=trigger, reserve_runes=reserve_runes)
    except IntegrityError:
        # The session was deleted while its summary was being written: the commit's snapshot
        # has no session to belong to. Nothing is lost (the chat is gone); not an ERROR.
        if ChatSession.objects.filter(pk=session_id).exists():
            raise
        logger.info("chat_compaction_session_deleted session=%s", session_id)
