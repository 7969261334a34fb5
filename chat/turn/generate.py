"""Generating one assistant reply: the one code path behind REST, server-sent events and the
WebSocket. It runs as a coroutine that is independent of whoever asked for it: a caller that goes
away (socket dropped, HTTP client gone) does not stop it, and the reply is stored either way.

Events follow the WebSocket contract and go to every socket of the session in every process,
and to the reply's own subscriber when there is one (chat/turn/registry.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chat import hooks
from chat.context import (
    ContextState,
    Payload,
    PayloadTooLarge,
    Trigger,
    context_budget_from_db,
    context_budget_from_state,
    context_compact,
    context_compaction_at_send,
    context_needs_compaction,
    context_payload_build,
    context_state_after_reply,
    context_state_fresh,
    context_state_read,
    context_strategy,
    context_window_probe_start,
)
from chat.context.prompt import agent_model
from chat.llm import get_provider, slots
from chat.llm.base import (
    ContextLengthExceeded,
    EmptyStream,
    LLMError,
    Message,
    StreamInterrupted,
)
from chat.llm.window import (
    tokens_learn,
    window_from_error,
    window_record_overflow,
    window_record_stated,
)
from chat.models import ChatMessage, MessageStatus
from chat.services.compaction import compaction_event_end, session_compact
from chat.services.titles import session_title_after_reply
from chat.shapes import compaction_started_event, done_event, error_event, message_payload
from chat.turn.registry import Emit, Generation, generation_tracked
from chat.turn.replies import reply_cancel_store, reply_finish
from chat.turn.rows import Prepared, Turn
from chat.turn.stream import stream_round
from chat.turn.toolloop import RoundsState, reply_rounds_run
from chat.workers import background_submit, in_worker

logger = logging.getLogger("chat.reply")

# Overflows recovered from in one reply: each learns a smaller window (docs/real-llm-notes.md).
MAX_OVERFLOW_RETRIES = 3


@dataclass(slots=True, frozen=True)
class ReplyResult:
    message: ChatMessage
    # The session's budget once the reply is stored (what `done` carried).
    context_budget: dict[str, Any]


async def reply_generate(*, turn: Turn, emit: Emit | None = None) -> ReplyResult:
    """Generate, stream and store the turn's reply row (status `streaming`).

    The rounds run in an inner task registered with chat/turn/registry.py, so a `cancel` from
    any socket in any process can stop them: the partial is stored as `cancelled`, `done` is
    published, and the cancelled reply is returned (the caller was not cancelled, the reply
    was). Cancelling the caller itself (server shutdown) stores the same and re-raises."""
    if turn.reply is None:
        raise ValueError("the turn has no reply row to generate")
    # Shared with the rounds: after a tool round the reply being written is a newer row, and a
    # cancel must finish that one.
    rounds = RoundsState(reply=turn.reply)
    gen = Generation(
        session_id=turn.session.pk,
        subscribers=[emit] if emit is not None else [],
        current_message_id=turn.reply.pk,
    )
    inner = asyncio.ensure_future(_generate(turn=turn, gen=gen, rounds=rounds))
    gen.task = inner
    slots.reply_started()
    async with generation_tracked(gen=gen):
        try:
            return await inner
        except asyncio.CancelledError:
            # Cancelled by the user (or the server shutting down): keep what was produced. Past
            # `done` (in the after-reply work) the reply is stored and announced already.
            result = gen.finished
            if result is None:
                result = await asyncio.shield(
                    in_worker(_finish_cancelled)(turn=turn, reply=rounds.reply)
                )
                _publish_done(gen, result)
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return result
        finally:
            gen.first_token_passed()  # a reply that ended without publishing anything
            slots.reply_ended()


def _publish_done(gen: Generation, result: ReplyResult) -> None:
    gen.finished = result
    gen.publish(
        done_event(message=message_payload(result.message), context_budget=result.context_budget)
    )


def turn_prepare(turn: Turn) -> Prepared:
    """Everything the reply needs from the database before its model call: the turn-started
    hooks, the context, the payload (or "compact first"). Adapters have it done in the same
    trip to the database as storing the turn: every trip is on the way to the first token."""
    events = _turn_started_hooks_run(turn)
    # A hook that reported something (a fact remembered) may have changed what the prompt
    # shows: load it again then; else the one the send's checks loaded stands.
    prompt = None if events else turn.prompt
    context_window_probe_start(session=turn.session)
    state = context_state_read(session=turn.session, query=turn.query, prompt=prompt)
    prepared = Prepared(
        events=events, state=state, compaction=context_compaction_at_send(state=state)
    )
    if prepared.compaction != "now":
        try:
            prepared.payload = context_payload_build(state=state)
        except PayloadTooLarge as exc:
            prepared.too_large = str(exc)
    return prepared


async def _generate(*, turn: Turn, gen: Generation, rounds: RoundsState) -> ReplyResult:
    started = time.monotonic()
    session_id, query = turn.session.pk, turn.query
    prepared = turn.prepared
    if prepared is None:
        prepared = await in_worker(turn_prepare)(turn)
    if prepared.compaction == "background":
        # Submitted from here, not while preparing: this reply already counts as in flight, so
        # on a one-slot server the summary lets it go first (chat/llm/slots.py). And only once
        # the first token is out: a session imported without a summary compacts all of its
        # history, whose reads and summarising would compete with the reply for the CPU.
        gen.after_first_token(
            lambda: background_submit(
                _compact_in_background, session_id=session_id, trigger="before_send"
            )
        )
    for event in prepared.events:
        gen.publish(event)
    state = prepared.state
    # Rows this send read to build its context (operators and the benchmark watch it: ours is
    # the verbatim tail, the seed's loop reads its whole history window every time).
    rows_read = state.rows_read
    summary_calls = 0
    payload, too_large = prepared.payload, prepared.too_large
    if prepared.compaction == "now":
        # Past the threshold is what the client hears about as a compaction.
        announced = context_needs_compaction(state=state)
        if announced:
            gen.publish(compaction_started_event())
        result = await in_worker(context_compact)(
            session_id=session_id, trigger="before_send", query=query
        )
        rows_read += result.rows_read
        summary_calls += result.llm_calls
        if result.changed:
            state = await in_worker(context_state_fresh)(
                session_id=session_id, query=query, prompt=state.prompt
            )
            rows_read += state.rows_read
        if announced:
            gen.publish(compaction_event_end(result, budget=context_budget_from_state(state=state)))
        try:
            payload = context_payload_build(state=state)
        except PayloadTooLarge as exc:
            too_large = str(exc)
    if payload is None:
        return await _fail(
            gen, turn, rounds.reply, "", "context_too_large", too_large, shown=too_large
        )

    provider = get_provider()
    model = agent_model(agent=turn.session.agent)

    async def stream(
        *, messages: list[Message], message_id: int, tools: list[dict[str, Any]] | None
    ) -> tuple[str, dict[str, Any]]:
        return await stream_round(
            gen=gen,
            provider=provider,
            messages=messages,
            model=model,
            tools=tools,
            message_id=message_id,
        )

    overflows = 0
    while True:
        try:
            outcome = await reply_rounds_run(
                session=turn.session,
                user_message_id=turn.user_message.pk if turn.user_message else None,
                state=rounds,
                messages=payload.messages,
                stream=stream,
                publish=gen.publish,
            )
            break
        except (ContextLengthExceeded, EmptyStream) as exc:
            # The prompt does not fit the model's window, however the server said so (a 400,
            # or a llama.cpp stream that ends before its first event): learn the window, so
            # this and every later payload is built for it, compact hard, and try again.
            if overflows >= MAX_OVERFLOW_RETRIES:
                return await _fail(gen, turn, rounds.reply, "", "context_too_large", str(exc))
            overflows += 1
            sent = "".join(str(m.get("content") or "") for m in payload.messages)
            stated = window_from_error(str(exc))
            learned = (
                window_record_stated(model=model or provider.model, tokens=stated)
                if stated
                else window_record_overflow(model=model or provider.model, text=sent)
            )
            logger.warning(
                "chat_reply_context_overflow session=%s window_tokens=%d payload_runes=%d error=%s",
                session_id,
                learned,
                payload.runes,
                str(exc)[:200],
            )
            gen.publish(compaction_started_event())
            result = await in_worker(context_compact)(
                session_id=session_id, trigger="context_error", force=True, query=query
            )
            # The state too, not only the payload: the reply's final write and its budget
            # go by what the payload was built from.
            state = await in_worker(context_state_fresh)(session_id=session_id, query=query)
            gen.publish(compaction_event_end(result, budget=context_budget_from_state(state=state)))
            try:
                payload = context_payload_build(state=state)
            except PayloadTooLarge:
                too_large = (
                    "This message alone is too large for the model's context window "
                    f"(about {learned} tokens); shorten it or split it."
                )
                return await _fail(
                    gen, turn, rounds.reply, "", "context_too_large", too_large, shown=too_large
                )
        except StreamInterrupted as exc:
            return await _fail(gen, turn, rounds.reply, exc.partial, "llm_stream_cut", str(exc))
        except LLMError as exc:
            return await _fail(gen, turn, rounds.reply, "", "llm_error", str(exc))

    if rounds.rounds <= 1:  # a tool round's prompt grew past `payload`: not a clean reading
        _tokens_learn(
            state=state, payload=payload, finish=outcome.finish, model=model or provider.model
        )
    finished, after = await in_worker(_finish)(
        state=state,
        reply=outcome.reply,
        # Tool rounds stored rows the state read before them does not hold.
        same_row=outcome.reply.pk == turn.reply.pk if turn.reply else False,
        content=outcome.text,
        metadata={
            "model": model or provider.model,
            "provider": provider.name,
            "usage": outcome.finish.get("usage"),
            **_cut_marker(outcome.finish),
            "payload_runes": payload.runes,
            "payload_dropped": payload.dropped,
            "rounds": rounds.rounds,
            "rows_read": rows_read,
            "summary_calls_waited": summary_calls,
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
    )
    _publish_done(gen, finished)
    await in_worker(_after_reply)(
        after=after, turn=turn, reply=finished.message, query_runes=len(query)
    )
    return finished


def _tokens_learn(
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


def _cut_marker(finish: dict[str, Any]) -> dict[str, Any]:
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


def _finish(
    *,
    state: ContextState,
    reply: ChatMessage,
    same_row: bool,
    content: str,
    metadata: dict[str, Any],
) -> tuple[ReplyResult, ContextState]:
    """The final write of a completed reply and the `done` event's budget, in one trip to a
    worker thread, with the context the budget was computed from (`_after_reply` decides on
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


def _finish_failed(
    *, turn: Turn, reply: ChatMessage, content: str, status: str, metadata: Any
) -> ReplyResult:
    """The final write of a reply that did not complete, and the budget as stored now."""
    written = reply_finish(
        message=reply, session=turn.session, content=content, status=status, metadata=metadata
    )
    budget = context_budget_from_db(session_id=turn.session.pk)
    return ReplyResult(message=written.message, context_budget=budget)


def _finish_cancelled(*, turn: Turn, reply: ChatMessage) -> ReplyResult:
    message = reply_cancel_store(reply=reply, session=turn.session)
    return ReplyResult(
        message=message, context_budget=context_budget_from_db(session_id=message.session_id)
    )


# What a user is told when a reply fails. The model server's own words (its error body, a
# host and port in a connection error) go to the log and to staff (metadata `error_detail`).
FAILURE_MESSAGES = {
    "llm_error": "The model could not answer; try again in a moment.",
    "llm_stream_cut": "The model's answer was cut off; what arrived is kept.",
    "context_too_large": "This conversation is too large for the model, even compacted.",
}


async def _fail(
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
    result = await in_worker(_finish_failed)(
        turn=turn,
        reply=reply,
        content=partial,
        status=MessageStatus.FAILED,
        metadata={"error": message, "error_code": code, "error_detail": error[:2000]},
    )
    gen.publish(error_event(code=code, message=message))
    _publish_done(gen, result)
    return result


def _after_reply(*, after: ContextState, turn: Turn, reply: ChatMessage, query_runes: int) -> None:
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
    _compact_later_if_due(after, query_runes)


def _turn_started_hooks_run(turn: Turn) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for hook in hooks.turn_started_hooks:
        try:
            events.extend(hook(session=turn.session, user_message=turn.user_message) or [])
        except Exception:
            logger.exception("chat_turn_started_hook_failed session=%s", turn.session.pk)
    return events


def _compact_later_if_due(state: ContextState, next_message_runes: int) -> None:
    """Compact now, in the background, if the next turn would cross the threshold: then the next
    send rarely waits for a summary."""
    if not settings.CHAT_BACKGROUND_COMPACTION or not context_strategy(state=state).in_background:
        return
    # Expect the next turn to be about as long as this one's question plus its answer.
    reserve = max(next_message_runes, 200) * 2
    if not context_needs_compaction(state=state, reserve_runes=reserve):
        return
    background_submit(
        _compact_in_background,
        session_id=state.session.pk,
        trigger="after_reply",
        reserve_runes=reserve,
    )


def _compact_in_background(*, session_id: int, trigger: Trigger, reserve_runes: int = 0) -> None:
    """A compaction no one waits for. On a one-slot model server (LLM_SERVER_SLOTS=1) it lets
    the replies in flight go first: a summary sent beside a reply would delay it, or cut it off
    (chat/llm/slots.py)."""
    if settings.LLM_SERVER_SLOTS != 1:
        session_compact(session_id=session_id, trigger=trigger, reserve_runes=reserve_runes)
        return
    with slots.background(timeout=settings.LLM_IDLE_WAIT_SECONDS):
        session_compact(session_id=session_id, trigger=trigger, reserve_runes=reserve_runes)
