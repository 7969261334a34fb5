"""Generating one assistant reply: the one code path behind REST, server-sent events and the
WebSocket. It runs as a coroutine that is independent of whoever asked for it: a caller that goes
away (socket dropped, HTTP client gone) does not stop it, and the reply is stored either way.

Events follow the WebSocket contract and go to every socket of the session in every process,
and to the reply's own subscriber when there is one (chat/turn/registry.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.conf import settings

from chat.context import (
    context_budget_from_state,
    context_compact,
    context_moved,
    context_needs_compaction,
    context_state_fresh,
)
from chat.context.prompt import reply_model
from chat.llm import get_provider, slots
from chat.llm.base import (
    ContextLengthExceeded,
    EmptyReply,
    EmptyStream,
    LLMError,
    Message,
    StreamInterrupted,
)
from chat.llm.window import (
    tokens_estimate,
    tokens_from_error,
    tokens_learn,
    window_from_error,
    window_learned_get,
    window_record_overflow,
    window_record_stated,
)
from chat.services.compaction import compaction_event_end
from chat.shapes import compaction_started_event
from chat.turn.failures import (
    done_publish,
    reply_cancelled_store,
    reply_fail,
    reply_fail_unexpected,
)
from chat.turn.finish import (
    ReplyResult,
    after_reply_run,
    compact_in_background,
    cut_marker,
    reply_result_complete,
    tokens_learn_from_usage,
)
from chat.turn.lease import lease_held
from chat.turn.prepare import Attempt, turn_prepare
from chat.turn.registry import Emit, Generation, generation_tracked
from chat.turn.rows import Turn
from chat.turn.stream import stream_round
from chat.turn.toolloop import RoundsResult, RoundsState, reply_rounds_run
from chat.workers import background_submit, foreground_exit, in_worker

logger = logging.getLogger("chat.reply")

# Overflows recovered from in one reply: each learns a smaller window (docs/real-llm-notes.md).
MAX_OVERFLOW_RETRIES = 3
# An answer with nothing in it to a prompt this share of the window or more is an overflow:
# llama-cpp-python answers a prompt that leaves it no room with an empty "stop" (at n_ctx 1024,
# 3 of 8 sends mixing English and Chinese stored such empty replies as complete, issue 25). The
# payload is built to leave the reply a quarter of the window by our estimate, which can be low
# by half (Chinese against an English-taught estimate, a window learned too large); compaction
# keeps it under two thirds of the window, so an answer to much less is not about room.
NEAR_WINDOW_SHARE = 0.5


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
    # The lease tells other processes this one is alive and generating (chat/turn/lease.py).
    async with lease_held(), generation_tracked(gen=gen):
        try:
            return await inner
        except asyncio.CancelledError:
            # Cancelled by the user (or the server shutting down): keep what was produced. Past
            # `done` (in the after-reply work) the reply is stored and announced already.
            result = gen.finished
            if result is None:
                result = await asyncio.shield(reply_cancelled_store(gen, turn, rounds.reply))
                done_publish(gen, result)
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return result
        except Exception as exc:
            # Whatever failed (the database at the final write, a bug): the reply's streams
            # still end, with `error` and `done`, never with silence.
            if gen.finished is not None:  # past `done`: the after-reply work failed
                logger.exception("chat_reply_after_done_failed session=%s", gen.session_id)
                return gen.finished
            return await reply_fail_unexpected(gen, turn, rounds.reply, exc)
        finally:
            gen.first_token_passed()  # a reply that ended without publishing anything
            slots.reply_ended()
            if turn.foreground is not None:
                # At the latest: the exit held for its first token waits on the event loop.
                foreground_exit(turn.foreground)


async def _generate(*, turn: Turn, gen: Generation, rounds: RoundsState) -> ReplyResult:
    started = time.monotonic()
    if turn.foreground is not None:
        key = turn.foreground
        gen.after_first_token(lambda: foreground_exit(key))
    prepared = turn.prepared or await in_worker(turn_prepare)(turn)
    if prepared.compaction == "background":
        _compact_after_first_token(gen, session_id=turn.session.pk)
    for event in prepared.events:
        gen.publish(event)
    attempt = Attempt(
        state=prepared.state,
        payload=prepared.payload,
        too_large=prepared.too_large,
        rows_read=prepared.state.rows_read,
    )
    if prepared.compaction == "now":
        await _compact_first(gen, turn=turn, attempt=attempt)
    if attempt.payload is None:
        too_large = attempt.too_large
        return await reply_fail(
            gen, turn, rounds.reply, "", "context_too_large", too_large, shown=too_large
        )
    provider = get_provider()
    model = reply_model(session=turn.session)
    # The model's name as its window and token estimates are filed under.
    named = model or provider.model

    async def stream(
        *, messages: list[Message], message_id: int, tools: list[dict[str, Any]] | None
    ) -> tuple[str, dict[str, Any]]:
        text, finish = await stream_round(
            gen=gen,
            provider=provider,
            messages=messages,
            model=model,
            tools=tools,
            message_id=message_id,
        )
        # Calls count only where tools were offered: calls alone, where none were (a plain
        # chat, an agent's last round), are an answer with nothing in it for the user.
        if not text.strip() and not (tools and finish.get("tool_calls")):
            reason = finish.get("finish_reason")
            raise EmptyReply(
                f"the model answered with nothing (finish_reason {reason})", finish=finish
            )
        return text, finish

    while True:
        try:
            assert attempt.payload is not None
            outcome = await reply_rounds_run(
                session=turn.session,
                user_message_id=turn.user_message.pk if turn.user_message else None,
                state=rounds,
                messages=attempt.payload.messages,
                stream=stream,
                publish=gen.publish,
            )
        except (ContextLengthExceeded, EmptyStream) as exc:
            failed = await _overflow_recover(gen, turn, rounds, attempt, model=named, exc=exc)
            if failed is not None:
                return failed
        except EmptyReply as exc:
            if not _near_window(attempt, model=named, finish=exc.finish):
                return await reply_fail(gen, turn, rounds.reply, "", "llm_empty_reply", str(exc))
            failed = await _overflow_recover(gen, turn, rounds, attempt, model=named, exc=exc)
            if failed is not None:
                return failed
        except StreamInterrupted as exc:
            return await reply_fail(
                gen, turn, rounds.reply, exc.partial, "llm_stream_cut", str(exc)
            )
        except LLMError as exc:
            return await reply_fail(gen, turn, rounds.reply, "", "llm_error", str(exc))
        else:
            return await _complete(
                gen, turn, rounds, attempt, outcome=outcome, model=named, started=started
            )


def _compact_after_first_token(gen: Generation, *, session_id: int) -> None:
    """Submitted from the reply, not while preparing: this reply already counts as in flight,
    so on a one-slot server the summary lets it go first (chat/llm/slots.py). And only once the
    first token is out: a session imported without a summary compacts all of its history,
    whose reads and summarising would compete with the reply for the CPU."""
    gen.after_first_token(
        lambda: background_submit(
            compact_in_background, session_id=session_id, trigger="before_send"
        )
    )


async def _compact_first(gen: Generation, *, turn: Turn, attempt: Attempt) -> None:
    """Compact before the model call and wait (background compaction off, or the seed's loop).
    A failure changes nothing: the payload is then built from the session as it is."""
    session_id, query = turn.session.pk, turn.query
    # Past the threshold is what the client hears about as a compaction.
    announced = context_needs_compaction(state=attempt.state)
    if announced:
        gen.publish(compaction_started_event())
    result = await in_worker(context_compact)(
        session_id=session_id, trigger="before_send", query=query
    )
    attempt.rows_read += result.rows_read
    attempt.summary_calls += result.llm_calls
    state = attempt.state
    # Read again when it changed anything, and when the session moved under it all the same
    # (another caller's compaction committed first: `skipped`, `busy`, `conflict`). Built from
    # the state read before, the payload would carry the old summary and a tail that no longer
    # fits, trimmed to fit. Asked, not assumed: the seed's loop is `skipped` on most sends.
    if result.changed or (
        result.outcome in ("skipped", "busy", "conflict")
        and await in_worker(context_moved)(session=state.session)
    ):
        state = await in_worker(context_state_fresh)(
            session_id=session_id, query=query, prompt=state.prompt
        )
        attempt.rows_read += state.rows_read
    if announced:
        gen.publish(compaction_event_end(result, budget=context_budget_from_state(state=state)))
    # Recall reads the database: the rebuild is sync code, in a worker.
    await in_worker(attempt.rebuild)(state)


def _near_window(attempt: Attempt, *, model: str, finish: dict[str, Any]) -> bool:
    """Whether an empty answer to the attempt's payload reads as an overflow: the prompt took
    most of a window known for the model (configured or learned), by the server's count when
    it gave one. Not without a window: an empty "length" to a short prompt once taught a window
    of 81 tokens; a server whose window is not known yet refuses a prompt over it outright
    (EmptyStream, a 400), and that teaches the window."""
    window = attempt.state.cfg.window_tokens or window_learned_get(model=model)
    if not window or attempt.payload is None:
        return False
    reported = (finish.get("usage") or {}).get("prompt_tokens")
    if isinstance(reported, int) and reported > 0:
        prompt = reported
    else:
        prompt = tokens_estimate(_payload_text(attempt.payload.messages), model=model)
    return prompt >= NEAR_WINDOW_SHARE * window


def _payload_text(messages: list[Message]) -> str:
    return "".join(str(m.get("content") or "") for m in messages)


async def _overflow_recover(
    gen: Generation,
    turn: Turn,
    rounds: RoundsState,
    attempt: Attempt,
    *,
    model: str,
    exc: Exception,
) -> ReplyResult | None:
    """The prompt did not fit the model's window, however the server said so (a 400, or a
    llama.cpp stream that ends before its first event): learn the window, so this and every
    later payload is built for it, compact hard, and rebuild the payload. The reply's failure
    when that cannot help (MAX_OVERFLOW_RETRIES, or the message alone is too large); None to
    try again."""
    if attempt.overflows >= MAX_OVERFLOW_RETRIES:
        return await reply_fail(gen, turn, rounds.reply, "", "context_too_large", str(exc))
    attempt.overflows += 1
    assert attempt.payload is not None
    refused = attempt.payload.runes
    sent = _payload_text(attempt.payload.messages)
    stated = window_from_error(str(exc))
    if stated is None and not isinstance(exc, ContextLengthExceeded):
        # A stream that says nothing of the window: ask the same prompt unstreamed, which a
        # llama.cpp-based server refuses with both figures, or answers with its usage.
        exc = await in_worker(_overflow_probe)(
            messages=attempt.payload.messages, model=model, sent=sent, exc=exc
        )
        stated = window_from_error(str(exc))
    reported = tokens_from_error(str(exc))
    if reported:  # the refusal counted the prompt: the tokenizer, learned exactly
        tokens_learn(model=model, text=sent, reported=reported)
    learned = (
        window_record_stated(model=model, tokens=stated)
        if stated
        else window_record_overflow(model=model, text=sent)
    )
    logger.warning(
        "chat_reply_context_overflow session=%s window_tokens=%d payload_runes=%d error=%s",
        gen.session_id,
        learned,
        attempt.payload.runes,
        str(exc)[:200],
    )
    session_id, query = turn.session.pk, turn.query
    gen.publish(compaction_started_event())
    result = await in_worker(context_compact)(
        session_id=session_id, trigger="context_error", force=True, query=query
    )
    # The state too, not only the payload: the reply's final write and its budget go by what
    # the payload was built from.
    state = await in_worker(context_state_fresh)(session_id=session_id, query=query)
    gen.publish(compaction_event_end(result, budget=context_budget_from_state(state=state)))
    # Recall reads the database: the rebuild is sync code, in a worker.
    await in_worker(attempt.rebuild)(state, under_runes=refused)
    if attempt.payload is not None:
        return None
    too_large = (
        "This message alone is too large for the model's context window "
        f"(about {learned} tokens); shorten it or split it."
    )
    return await reply_fail(
        gen, turn, rounds.reply, "", "context_too_large", too_large, shown=too_large
    )


def _overflow_probe(*, messages: list[Message], model: str, sent: str, exc: Exception) -> Exception:
    """The prompt a stream overflowed on, sent once more without streaming for one token: the
    refusal states the window and the prompt's tokens (llama-cpp-python streams neither, nor
    any usage); an answer states the prompt's tokens in its usage. Either teaches the estimate
    what this prompt really took. Returns the refusal, else `exc`."""
    try:
        answer = get_provider().complete(
            messages=messages, model=model, max_tokens=1, timeout=settings.LLM_TIMEOUT_SECONDS
        )
    except ContextLengthExceeded as refused:
        return refused
    except LLMError as failed:  # the probe only informs: its failure changes nothing
        logger.info("chat_reply_overflow_probe_failed error=%s", str(failed)[:200])
        return exc
    reported = answer.usage.prompt_tokens if answer.usage else None
    if reported:
        tokens_learn(model=model, text=sent, reported=reported)
    return exc


async def _complete(
    gen: Generation,
    turn: Turn,
    rounds: RoundsState,
    attempt: Attempt,
    *,
    outcome: RoundsResult,
    model: str,
    started: float,
) -> ReplyResult:
    """The model answered: store the reply, announce it, then the after-reply work."""
    payload = attempt.payload
    assert payload is not None
    if rounds.rounds <= 1:  # a tool round's prompt grew past `payload`: not a clean reading
        tokens_learn_from_usage(
            state=attempt.state, payload=payload, finish=outcome.finish, model=model
        )
    provider = get_provider()
    finished, after = await in_worker(reply_result_complete)(
        state=attempt.state,
        reply=outcome.reply,
        # Tool rounds stored rows the state read before them does not hold.
        same_row=outcome.reply.pk == turn.reply.pk if turn.reply else False,
        content=outcome.text,
        metadata={
            "model": model,
            "provider": provider.name,
            "usage": outcome.finish.get("usage"),
            **cut_marker(outcome.finish),
            "payload_runes": payload.runes,
            "payload_dropped": payload.dropped,
            "rounds": rounds.rounds,
            "rows_read": attempt.rows_read,
            "summary_calls_waited": attempt.summary_calls,
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
    )
    done_publish(gen, finished)
    await in_worker(after_reply_run)(
        after=after, turn=turn, reply=finished.message, query_runes=len(turn.query)
    )
    return finished
