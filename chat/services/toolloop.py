"""The reply's model rounds. Today: one round, no tools. The work-agents issue turns this into
`RunAgentToolLoop` (SPEC §5): several rounds of tool calls per user message, tool results stored
as messages and streamed as events, checkpoint summaries of earlier rounds near the budget.

Contract with chat.services.reply (keep it when extending):
- `reply_rounds_run` is awaited once per reply, after the payload is built.
- It streams each model call with `stream_round(messages=..., message_id=..., tools=...)`, which
  emits `delta` events for `message_id`, saves progress, and returns (text, finish) where
  finish has "finish_reason", "usage" and "tool_calls" (OpenAI format list, possibly empty).
- `state.message_id` always names the assistant row currently being written, so the caller can
  mark the right row failed/cancelled when a round raises (LLMError, CancelledError...).
- It returns the id of the final assistant row, its text and the last finish dict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chat.llm.base import Message
from chat.models import ChatSession

StreamRound = Callable[..., Awaitable[tuple[str, dict[str, Any]]]]
Emit = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class RoundsState:
    message_id: int
    rounds: int = 0


@dataclass(slots=True)
class RoundsResult:
    message_id: int
    text: str
    finish: dict[str, Any]


async def reply_rounds_run(
    *,
    session: ChatSession,
    state: RoundsState,
    messages: list[Message],
    stream_round: StreamRound,
    emit: Emit,
) -> RoundsResult:
    text, finish = await stream_round(messages=messages, message_id=state.message_id, tools=None)
    state.rounds = 1
    return RoundsResult(message_id=state.message_id, text=text, finish=finish)
