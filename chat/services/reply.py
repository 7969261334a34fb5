"""Generating one assistant reply: the one code path behind REST, server-sent events and the
WebSocket. It runs as a coroutine that is independent of whoever asked for it: a caller that goes
away (socket dropped, HTTP client gone) does not stop it, and the reply is stored either way.

Events follow the WebSocket contract and go to the session's channel group (every socket, every
process) and, when given, to a local `emit` callback (the server-sent-events response)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chat.llm import get_provider
from chat.llm.base import ContextLengthExceeded, LLMError, StreamInterrupted
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.services import context as ctx
from chat.services import hooks
from chat.services.background import background_submit
from chat.services.events import event_publish_now
from chat.services.messages import (
    TurnStart,
    message_payload,
    reply_complete,
    reply_finish,
    reply_progress,
    reply_progress_many,
)
from chat.services.realtime import (
    generation_publish,
    generation_publish_delta_now,
    generation_tracked,
)
from chat.services.toolloop import RoundsState, reply_rounds_run
from chat.services.workers import in_worker

logger = logging.getLogger("chat.reply")

Emit = Callable[[dict[str, Any]], Awaitable[None]]
# Progress saves: at most this often, so a long reply costs a handful of UPDATEs, not one per
# token, and a crash loses at most this much text.
SAVE_EVERY_SECONDS = 0.5


async def _send(session_id: int, emit: Emit | None, event: dict[str, Any]) -> None:
    await generation_publish(session_id=session_id, event=event)
    if emit is not None:
        await emit(event)


def _compaction_state(outcome: str) -> str:
    return "done" if outcome in ("committed", "skipped", "busy", "conflict") else "failed"


async def reply_generate(
    *,
    session_id: int,
    assistant_message_id: int,
    query: str,
    emit: Emit | None = None,
    turn: TurnStart | None = None,
) -> ChatMessage:
    """Generate, stream and store the reply row `assistant_message_id` (status `streaming`).

    `turn`: the rows `turn_start` just stored, when the caller has them; saves reading them
    back (with 200 sends at once every query here is GIL time the streams wait for).

    The rounds run in an inner task registered with chat.services.realtime, so a `cancel` from
    any socket in any process can stop them: the partial is stored as `cancelled`, `done` is
    emitted, and the cancelled message is returned (the caller was not cancelled, the reply
    was). Cancelling the caller itself (server shutdown) stores the same and re-raises."""
    # Shared with the rounds: after a tool round the reply being written is a newer row, and a
    # cancel must finish that one.
    rounds = RoundsState(message_id=assistant_message_id)
    inner = asyncio.ensure_future(
        _generate(
            session_id=session_id,
            assistant_message_id=assistant_message_id,
            query=query,
            emit=emit,
            rounds=rounds,
            turn=turn,
        )
    )
    async with generation_tracked(
        session_id=session_id, message_id=assistant_message_id, task=inner
    ):
        try:
            return await inner
        except asyncio.CancelledError:
            # Cancelled by the user (or the server shutting down): keep what was produced.
            message, budget = await asyncio.shield(
                in_worker(_finish_cancelled)(session_id, rounds.message_id)
            )
            await asyncio.shield(_done(session_id, emit, message, budget))
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return message


def _finish_cancelled(session_id: int, message_id: int) -> tuple[ChatMessage, dict[str, Any]]:
    current = ChatMessage.objects.get(pk=message_id)
    if current.status != MessageStatus.STREAMING:
        return current, ctx.context_budget_read(session_id=session_id)
    message, budget, _ = _finish(
        session_id=session_id,
        message_id=message_id,
        content=current.content,
        status=MessageStatus.CANCELLED,
    )
    return message, budget


async def _done(
    session_id: int, emit: Emit | None, message: ChatMessage, budget: dict[str, Any]
) -> None:
    await _send(
        session_id,
        emit,
        {"type": "done", "message": message_payload(message), "context_budget": budget},
    )


async def _generate(
    *,
    session_id: int,
    assistant_message_id: int,
    query: str,
    emit: Emit | None,
    rounds: RoundsState,
    turn: TurnStart | None,
) -> ChatMessage:
    started = time.monotonic()
    if turn is not None and (
        turn.assistant_message is None or turn.assistant_message.pk != assistant_message_id
    ):
        raise ValueError("turn does not hold the reply row being generated")
    prepared = await in_worker(_prepare)(assistant_message_id, session_id, query, turn)
    for event in prepared.events:
        await _send(session_id, emit, event)
    session, state = prepared.session, prepared.state
    # Rows this send read to build its context (operators and the benchmark watch it: ours is
    # the verbatim tail, the seed's loop reads its whole history window every time).
    rows_read = state.rows_read
    summary_calls = 0
    payload, too_large = prepared.payload, prepared.too_large
    if prepared.roll_first:
        # `needed` (over the threshold) is what the client hears about as a compaction.
        needed = ctx.context_needs_roll(state=state)
        if needed:
            await _send(session_id, emit, {"type": "compaction", "state": "started"})
        roll = await in_worker(ctx.context_roll)(
            session_id=session_id, trigger="before_send", query=query
        )
        if needed:
            await _send(
                session_id, emit, {"type": "compaction", "state": _compaction_state(roll.outcome)}
            )
        rows_read += roll.rows_read
        summary_calls += roll.llm_calls
        if roll.changed:
            state = await in_worker(ctx.context_state_fresh)(session_id=session_id, query=query)
            rows_read += state.rows_read
        try:
            payload = await in_worker(ctx.context_payload)(
                session_id=session_id, query=query, compact=False, state=state
            )
        except ctx.PayloadTooLarge as exc:
            too_large = str(exc)
    if payload is None:
        return await _fail(
            session_id, emit, assistant_message_id, "", "context_too_large", too_large
        )

    provider = get_provider()
    model = (session.agent.model if session.agent else "") or None

    async def stream_round(
        *, messages: list[dict[str, Any]], message_id: int, tools: list[dict[str, Any]] | None
    ) -> tuple[str, dict[str, Any]]:
        return await _stream(
            provider=provider,
            messages=messages,
            model=model,
            tools=tools,
            session_id=session_id,
            message_id=message_id,
            emit=emit,
        )

    async def send_event(event: dict[str, Any]) -> None:
        await _send(session_id, emit, event)

    retried_context = False
    while True:
        try:
            outcome = await reply_rounds_run(
                session=session,
                state=rounds,
                messages=payload.messages,
                stream_round=stream_round,
                emit=send_event,
            )
            break
        except ContextLengthExceeded as exc:
            # Our rune estimate was too generous for this model: compact hard and retry once.
            if retried_context:
                return await _fail(
                    session_id, emit, rounds.message_id, "", "context_too_large", str(exc)
                )
            retried_context = True
            await _send(session_id, emit, {"type": "compaction", "state": "started"})
            roll = await in_worker(ctx.context_roll)(
                session_id=session_id, trigger="context_error", force=True, query=query
            )
            await _send(
                session_id, emit, {"type": "compaction", "state": _compaction_state(roll.outcome)}
            )
            payload = await in_worker(ctx.context_payload)(
                session_id=session_id, query=query, compact=False
            )
        except StreamInterrupted as exc:
            return await _fail(
                session_id, emit, rounds.message_id, exc.partial, "llm_stream_cut", str(exc)
            )
        except LLMError as exc:
            return await _fail(session_id, emit, rounds.message_id, "", "llm_error", str(exc))

    text, finish = outcome.text, outcome.finish
    message, budget, after = await in_worker(_finish)(
        session_id=session_id,
        message_id=outcome.message_id,
        held=turn.assistant_message if turn is not None else None,
        # A roll before the call re-read the session: not the one turn_start locked.
        context=prepared.state if turn is not None and not prepared.roll_first else None,
        content=text,
        status=MessageStatus.COMPLETE,
        metadata={
            "model": model or provider.model,
            "provider": provider.name,
            "usage": finish.get("usage"),
            "payload_runes": payload.runes,
            "payload_dropped": payload.dropped,
            "rounds": rounds.rounds,
            "rows_read": rows_read,
            "summary_calls_waited": summary_calls,
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
    )
    await _done(session_id, emit, message, budget)
    await in_worker(_after_reply)(
        after=after, user_message=prepared.user_message, assistant=message, query_runes=len(query)
    )
    return message


@dataclass(slots=True, kw_only=True)
class _Prepared:
    """Everything a send needs from the database before the model call, gathered in one trip
    to a worker thread (it took four: with 200 sends at once, every trip holds the GIL the
    event loop needs for the other replies' tokens; bench/realtime.py)."""

    events: list[dict[str, Any]]
    session: ChatSession
    user_message: ChatMessage | None
    state: ctx.ContextState
    # Compact before this call; the payload is then built after the roll, not here.
    roll_first: bool
    payload: ctx.Payload | None = None
    too_large: str = ""  # why no payload can fit (PayloadTooLarge)


def _prepare(
    assistant_message_id: int, session_id: int, query: str, turn: TurnStart | None
) -> _Prepared:
    user_message: ChatMessage | None
    if turn is not None and turn.assistant_message is not None:
        # The session as locked by turn_start a moment ago, its agent loaded with it.
        session, user_message = turn.assistant_message.session, turn.user_message
    else:
        session, user_message, _ = _turn_messages(assistant_message_id)
    events = _run_turn_started_hooks(session=session, user_message=user_message)
    state = ctx.context_state_read(session=session, query=query)
    prepared = _Prepared(
        events=events,
        session=session,
        user_message=user_message,
        state=state,
        roll_first=ctx.context_roll_before_call(state=state),
    )
    if not prepared.roll_first:
        try:
            prepared.payload = ctx.context_payload(
                session_id=session_id, query=query, compact=False, state=state
            )
        except ctx.PayloadTooLarge as exc:
            prepared.too_large = str(exc)
    return prepared


def _finish(
    *,
    session_id: int,
    message_id: int,
    content: str,
    status: str,
    metadata: dict[str, Any] | None = None,
    held: ChatMessage | None = None,
    context: ctx.ContextState | None = None,
) -> tuple[ChatMessage, dict[str, Any], ctx.ContextState]:
    """The final write and the `done` event's budget in one trip to a worker thread, with the
    context the budget was computed from (`_after_reply` decides on compaction from it).
    `held`: the reply row as turn_start stored it, and `context`: what this reply's payload was
    built from, read from `held.session` (what reply_complete's guard compares). A reply that
    completed in the held row is written with guarded UPDATEs (`reply_complete`), and when
    they show that nothing moved the context meanwhile, its budget is `context` plus the
    reply, with no read-back."""
    completed = None
    if held is not None and held.pk == message_id and status == MessageStatus.COMPLETE:
        completed = reply_complete(message=held, content=content, metadata=metadata or {})
    state = None
    if completed is None:
        message = reply_finish(
            message_id=message_id, content=content, status=status, metadata=metadata
        )
    else:
        message = completed.message
        if completed.context_unchanged and context is not None:
            state = ctx.context_state_appended(state=context, message=message)
    if state is None:
        state = ctx.context_state_fresh(session_id=session_id)
    return message, ctx.context_budget_of(state=state), state


def _after_reply(
    *,
    after: ctx.ContextState,
    user_message: ChatMessage | None,
    assistant: ChatMessage,
    query_runes: int,
) -> None:
    """Hooks and the background-compaction decision, on the rows this reply already holds:
    `after` is the session and context as the final write's trip worked them out (`_finish`)."""
    session = after.session
    _run_turn_finished_hooks(session=session, user_message=user_message, assistant=assistant)
    _maybe_compact_later(after, query_runes)


def _turn_messages(
    assistant_message_id: int,
) -> tuple[ChatSession, ChatMessage | None, ChatMessage]:
    assistant = ChatMessage.objects.select_related("session__agent").get(pk=assistant_message_id)
    reply_to = assistant.metadata.get("reply_to")
    user_message = ChatMessage.objects.filter(pk=reply_to).first() if reply_to else None
    return assistant.session, user_message, assistant


def _run_turn_started_hooks(
    *, session: ChatSession, user_message: ChatMessage | None
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for hook in hooks.turn_started_hooks:
        try:
            events.extend(hook(session=session, user_message=user_message) or [])
        except Exception:
            logger.exception("chat_turn_started_hook_failed session=%s", session.pk)
    return events


def _run_turn_finished_hooks(
    *, session: ChatSession, user_message: ChatMessage | None, assistant: ChatMessage
) -> None:
    for hook in hooks.turn_finished_hooks:
        try:
            hook(session=session, user_message=user_message, assistant_message=assistant)
        except Exception:
            logger.exception("chat_turn_finished_hook_failed session=%s", session.pk)


class _ProgressWriter:
    """Saves every streaming reply of this event loop every SAVE_EVERY_SECONDS, all in one
    transaction. Streams only register their growing list of pieces; no token waits for a write,
    and the database sees one connection and one commit per interval instead of one per reply
    (the per-reply saves were half the server's CPU with 200 streams). The saves are also the
    liveness signal (updated_at) that keeps a live reply from being swept as stale."""

    def __init__(self) -> None:
        self._live: dict[int, list[str]] = {}
        self._saved: dict[int, int] = {}  # pieces already written, per reply
        self._task: asyncio.Task[None] | None = None
        self.inflight: asyncio.Future[None] | None = None

    def track(self, message_id: int, parts: list[str]) -> None:
        self._live[message_id] = parts
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def untrack(self, message_id: int) -> None:
        self._live.pop(message_id, None)
        self._saved.pop(message_id, None)

    async def _run(self) -> None:
        while self._live:
            await asyncio.sleep(SAVE_EVERY_SECONDS)
            batch = {
                message_id: "".join(parts)
                for message_id, parts in list(self._live.items())
                if len(parts) != self._saved.get(message_id)
            }
            for message_id in batch:
                self._saved[message_id] = len(self._live[message_id])
            if not batch:
                continue
            self.inflight = asyncio.ensure_future(in_worker(reply_progress_many)(updates=batch))
            try:
                await self.inflight
            except Exception:
                logger.exception("chat_reply_progress_failed replies=%d", len(batch))


_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ProgressWriter] = (
    weakref.WeakKeyDictionary()
)


def _progress_writer() -> _ProgressWriter:
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = _ProgressWriter()
    return writer


class _DeltaPump:
    """Publishes a reply's text as `delta` events, coalescing under load.

    Usually a token goes straight into this process's socket outboxes from the stream reader
    (`generation_publish_delta_now`); the sockets' own tasks merge what piles up while they
    wait (chat/services/events.py). When a delta must also cross the channel layer (a socket
    of another process watches) or go to `emit` (a server-sent-events response), both awaited,
    the reader only appends to a buffer and this task sends whatever has accumulated each time
    it runs: when the process is saturated, tokens pile up between its runs and leave as one
    event, so the per-event cost is paid per batch and throughput rises to meet demand instead
    of a backlog growing without bound (bench/realtime.py). `offset` is where a batch starts in
    the reply and `emitted_at` the provider's emit time of its first token, so clients and the
    benchmark see the worst case."""

    def __init__(self, *, session_id: int, message_id: int, emit: Emit | None) -> None:
        self._session_id = session_id
        self._message_id = message_id
        self._emit = emit
        self._pending: list[str] = []
        self._offset = 0  # of the first pending piece
        self._sent = 0
        self._emitted_at: float | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._sending = False
        self._task = asyncio.ensure_future(self._run())

    def push(self, text: str, emitted_at: float | None) -> None:
        if self._emit is None and not self._pending and not self._sending:
            delta = self._delta(text, self._sent, emitted_at)
            if generation_publish_delta_now(session_id=self._session_id, event=delta):
                self._sent += len(text)
                return
        if not self._pending:
            self._offset = self._sent
            self._emitted_at = emitted_at
        self._pending.append(text)
        self._sent += len(text)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                delta = self._delta("".join(self._pending), self._offset, self._emitted_at)
                self._pending = []
                self._sending = True
                try:
                    await _send(self._session_id, self._emit, delta)
                finally:
                    self._sending = False
            if self._closing and not self._pending:
                return

    def _delta(self, text: str, offset: int, emitted_at: float | None) -> dict[str, Any]:
        delta: dict[str, Any] = {
            "type": "delta",
            "message_id": self._message_id,
            "text": text,
            # offset: where this piece starts in the reply; lets a reconnecting socket drop
            # pieces its resumed partial already holds (chat/consumers.py).
            "offset": offset,
        }
        if emitted_at is not None:
            delta["emitted_at"] = emitted_at
        return delta

    async def close(self) -> None:
        """Send what is left, then stop (before `done` goes out)."""
        self._closing = True
        self._wake.set()
        await self._task

    def abort(self) -> None:
        self._task.cancel()


async def _stream(
    *,
    provider: Any,
    messages: list[dict[str, Any]],
    model: str | None,
    tools: list[dict[str, Any]] | None,
    session_id: int,
    message_id: int,
    emit: Emit | None,
) -> tuple[str, dict[str, Any]]:
    parts: list[str] = []
    pump = _DeltaPump(session_id=session_id, message_id=message_id, emit=emit)
    writer = _progress_writer()
    writer.track(message_id, parts)
    finish: dict[str, Any] = {}
    try:
        # aclosing: on cancel the HTTP stream is closed at once, not when the GC gets to it.
        async with aclosing(
            provider.astream_chat(messages=messages, model=model, tools=tools)
        ) as stream:
            async for event in stream:
                if event.kind == "delta" and event.text:
                    parts.append(event.text)
                    # emitted_at: the provider's own emit time (the fake server sends it), so a
                    # client can measure the latency this server adds (bench/realtime.py).
                    pump.push(event.text, event.emitted_at)
                elif event.kind == "done":
                    usage = event.usage
                    finish = {
                        "finish_reason": event.finish_reason,
                        "tool_calls": [call.as_openai() for call in event.tool_calls],
                        "usage": None
                        if usage is None
                        else {
                            "prompt_tokens": usage.prompt_tokens,
                            "completion_tokens": usage.completion_tokens,
                            "total_tokens": usage.total_tokens,
                        },
                    }
                    if event.text and not parts:
                        parts.append(event.text)
    except asyncio.CancelledError:
        pump.abort()
        writer.untrack(message_id)
        if writer.inflight is not None and not writer.inflight.done():
            # An older batch still in flight must not land after the final save below.
            await asyncio.shield(writer.inflight)
        await asyncio.shield(
            in_worker(reply_progress)(message_id=message_id, content="".join(parts))
        )
        raise
    except StreamInterrupted as exc:
        writer.untrack(message_id)
        await pump.close()
        exc.partial = exc.partial or "".join(parts)
        raise
    except BaseException:
        writer.untrack(message_id)
        pump.abort()
        raise
    # The caller's final write follows; a batch landing after it is a no-op (status filter).
    writer.untrack(message_id)
    await pump.close()
    return "".join(parts), finish


async def _fail(
    session_id: int, emit: Emit | None, message_id: int, partial: str, code: str, error: str
) -> ChatMessage:
    logger.warning(
        "chat_reply_failed session=%s message=%s code=%s error=%s",
        session_id,
        message_id,
        code,
        error,
    )
    message, budget, _ = await in_worker(_finish)(
        session_id=session_id,
        message_id=message_id,
        content=partial,
        status=MessageStatus.FAILED,
        metadata={"error": error[:2000], "error_code": code},
    )
    await _send(session_id, emit, {"type": "error", "code": code, "message": error[:500]})
    await _done(session_id, emit, message, budget)
    return message


def _maybe_compact_later(state: ctx.ContextState, next_message_runes: int) -> None:
    """Compact now, in the background, if the next turn would cross the threshold: then the next
    send rarely waits for a summary. The seed's strategy has no such step (it compacts inline)."""
    if not settings.CHAT_BACKGROUND_COMPACTION:
        return
    session = state.session
    if state.cfg.strategy != "cadau":
        return
    # Expect the next turn to be about as long as this one's question plus its answer.
    reserve = max(next_message_runes, 200) * 2
    if not ctx.context_needs_roll(state=state, reserve_runes=reserve):
        return
    background_submit(
        compact_with_events, session_id=session.pk, trigger="after_reply", reserve_runes=reserve
    )


def compact_with_events(
    *,
    session_id: int,
    trigger: ctx.Trigger,
    force: bool = False,
    instructions: str = "",
    reserve_runes: int = 0,
) -> ctx.RollResult:
    """Compaction with `compaction` events around it (background and "compact now")."""
    event_publish_now(session_id=session_id, event={"type": "compaction", "state": "started"})
    result = ctx.context_roll(
        session_id=session_id,
        trigger=trigger,
        force=force,
        instructions=instructions,
        reserve_runes=reserve_runes,
    )
    event_publish_now(
        session_id=session_id,
        event={"type": "compaction", "state": _compaction_state(result.outcome)},
    )
    return result
