"""One model call of a reply, streamed: tokens go out as `delta` events while they arrive, and
the growing text is saved every SAVE_EVERY_SECONDS."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from chat.llm.base import LLMProvider, Message, StreamEvent, StreamInterrupted
from chat.shapes import delta_event
from chat.turn.registry import Generation
from chat.turn.replies import reply_progress, reply_progress_many
from chat.workers import in_worker

logger = logging.getLogger("chat.reply")

# Progress saves: at most this often, so a long reply costs a handful of UPDATEs, not one per
# token, and a crash loses at most this much text.
SAVE_EVERY_SECONDS = 0.5
# After a reply's first token is published, the stream waits this long before reading on. A
# server that sends a burst (a whole short reply in one read, as a fast or loaded server does)
# was otherwise parsed, published and handed to the final write before any subscriber's task
# ran: the first token reached the response 1.6-2.7 ms after it arrived when the server had
# idled, 0.6-0.8 ms back to back (server-sent events, fresh session, bench/ttft_steps.py).
# The subscribers need a few turns of the event loop; one millisecond is the loop's timer
# resolution, and only the second token waits for it. Each model round of a reply (tool
# calls) waits once, with or without subscribers: not worth telling apart.
FIRST_TOKEN_HANDOFF_SECONDS = 0.001


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


async def stream_round(
    *,
    gen: Generation,
    provider: LLMProvider,
    messages: list[Message],
    model: str | None,
    tools: list[dict[str, Any]] | None,
    message_id: int,
) -> tuple[str, dict[str, Any]]:
    """Stream one model call into reply row `message_id`. Returns (text, finish), finish with
    "finish_reason", "usage" and "tool_calls" (OpenAI format, possibly empty). Raises LLMError;
    on StreamInterrupted its `partial` holds the text that arrived."""
    parts: list[str] = []
    gen.stream_started(message_id=message_id, parts=parts)
    writer = _progress_writer()
    writer.track(message_id, parts)
    finish: dict[str, Any] = {}
    sent = 0
    try:
        # aclosing: on cancel the HTTP stream is closed at once, not when the GC gets to it.
        # (Providers implement astream_chat as async generators.)
        events = cast(
            AsyncGenerator[StreamEvent, None],
            provider.astream_chat(messages=messages, model=model, tools=tools),
        )
        async with aclosing(events) as stream:
            async for event in stream:
                if event.kind == "delta" and event.text:
                    parts.append(event.text)
                    gen.publish(
                        delta_event(
                            message_id=message_id,
                            text=event.text,
                            offset=sent,
                            emitted_at=event.emitted_at,
                        )
                    )
                    if not sent and FIRST_TOKEN_HANDOFF_SECONDS:
                        # A moment for the subscribers to write the token out (a few turns
                        # of the loop) before the rest of a burst is read.
                        await asyncio.sleep(FIRST_TOKEN_HANDOFF_SECONDS)
                    sent += len(event.text)
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
        writer.untrack(message_id)
        if writer.inflight is not None and not writer.inflight.done():
            # An older batch still in flight must not land after the final save below.
            await asyncio.shield(writer.inflight)
        await asyncio.shield(
            in_worker(reply_progress)(message_id=message_id, content="".join(parts))
        )
        raise
    except StreamInterrupted as exc:
        exc.partial = exc.partial or "".join(parts)
        raise
    finally:
        # The caller's final write follows; a batch landing after it is a no-op (status filter).
        writer.untrack(message_id)
    return "".join(parts), finish
