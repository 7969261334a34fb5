"""The reply's model rounds: `RunAgentToolLoop` (the design's name), `agent_tool_loop_run` here.

A session without an agent, or an agent with no enabled tools, gets one round and no tools.
An agent session offers its tools (chat.tools); while the model answers with tool calls:

1. the assistant row being written keeps its text and gets `tool_calls` (event `tool_call`);
2. each call runs (errors become the result text, never an exception) and its result is stored
   as a `tool` message (event `tool_result` per call);
3. that row is marked complete and a new `streaming` assistant row (metadata `reply_to` = the
   user message, `tool_round`) is created in the same transaction, and the next round streams
   into it.

After `max_tool_rounds` rounds with tool calls (agent config, default 8) the model is called
once more without tools, to answer with what it has. A row stays `streaming` until its tools
have run, so "one reply at a time" (chat/turn/rows.py) holds through the whole loop. When the
loop's own payload grows past the threshold, earlier round trips are checkpointed
(chat/turn/checkpoint.py).

Contract with chat/turn/generate.py:
- `reply_rounds_run` is awaited once per reply, after the payload is built (again, with the same
  state, when the provider refused the context and the session was compacted).
- It streams each model call with `stream(messages=..., message_id=..., tools=...)`, which
  publishes `delta` events for `message_id`, saves progress, and returns (text, finish) where
  finish has "finish_reason", "usage" and "tool_calls" (OpenAI format list, possibly empty).
- `state.reply` always is the assistant row currently being written, so the caller can mark
  the right row failed/cancelled when a round raises (LLMError, CancelledError...).
- It returns the final assistant row, its text and the last finish dict.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chat.context import context_config_for
from chat.llm.base import Message
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.services.agents import agent_settings, agent_tools
from chat.shapes import message_payload, tool_call_event, tool_result_event
from chat.tools import Tool, ToolContext, tool_run
from chat.turn.checkpoint import LoopWindow
from chat.turn.replies import (
    reply_round_cancel,
    reply_round_next,
    reply_tool_calls_set,
    tool_message_create,
)
from chat.workers import in_worker

logger = logging.getLogger("chat.toolloop")

StreamRound = Callable[..., Awaitable[tuple[str, dict[str, Any]]]]
Publish = Callable[[dict[str, Any]], None]


@dataclass(slots=True)
class RoundsState:
    # The assistant row being written: after a tool round, a newer row than the turn's.
    reply: ChatMessage
    # Model calls made for this reply, and how many of them ended in tool calls (the round
    # limit counts these, across a context-error retry of the whole loop).
    rounds: int = 0
    tool_rounds: int = 0


@dataclass(slots=True)
class RoundsResult:
    reply: ChatMessage
    text: str
    finish: dict[str, Any]


async def reply_rounds_run(
    *,
    session: ChatSession,
    user_message_id: int | None,
    state: RoundsState,
    messages: list[Message],
    stream: StreamRound,
    publish: Publish,
) -> RoundsResult:
    tools = agent_tools(agent=session.agent)
    if not tools:
        text, finish = await stream(messages=messages, message_id=state.reply.pk, tools=None)
        state.rounds += 1
        return RoundsResult(reply=state.reply, text=text, finish=finish)
    return await agent_tool_loop_run(
        session=session,
        user_message_id=user_message_id,
        state=state,
        messages=messages,
        stream=stream,
        publish=publish,
        tools=tools,
    )


# --- the rows of a tool round --------------------------------------------------------------


# --- the loop -------------------------------------------------------------------------------


def _normalised_calls(calls: list[Any], *, message_id: int) -> list[dict[str, Any]]:
    """OpenAI-shaped calls with an id each (some local servers omit it; results need one)."""
    out = []
    for i, call in enumerate(c for c in calls if isinstance(c, dict)):
        raw = call.get("function")
        function: dict[str, Any] = raw if isinstance(raw, dict) else {}
        arguments = function.get("arguments", "")
        out.append(
            {
                "id": str(call.get("id") or f"call_{message_id}_{i}"),
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return out


async def agent_tool_loop_run(
    *,
    session: ChatSession,
    user_message_id: int | None,
    state: RoundsState,
    messages: list[Message],
    stream: StreamRound,
    publish: Publish,
    tools: list[Tool],
) -> RoundsResult:
    """RunAgentToolLoop: see the module docstring."""
    agent = session.agent
    assert agent is not None  # agent_tools() is empty without one
    max_rounds = agent_settings(agent=agent, capped=not session.owner.is_staff).max_tool_rounds
    specs = [tool.as_openai() for tool in tools]
    enabled = {tool.name: tool for tool in tools}
    context = ToolContext(
        agent_id=agent.pk,
        session_id=session.pk,
        user_id=session.owner_id,
        user_message_id=user_message_id,
    )
    window = LoopWindow(
        session_id=session.pk, base=list(messages), cfg=context_config_for(session=session)
    )
    while True:
        offer = state.tool_rounds < max_rounds
        call_messages = await in_worker(window.messages_for_call)()
        text, finish = await stream(
            messages=call_messages, message_id=state.reply.pk, tools=specs if offer else None
        )
        state.rounds += 1
        calls = _normalised_calls(finish.get("tool_calls") or [], message_id=state.reply.pk)
        if calls and not offer:
            logger.warning(
                "chat_agent_tool_round_limit session=%s rounds=%d ignored_calls=%d",
                session.pk,
                state.tool_rounds,
                len(calls),
            )
        if not calls or not offer:
            return RoundsResult(reply=state.reply, text=text, finish=finish)
        state.tool_rounds += 1
        row = await in_worker(reply_tool_calls_set)(
            message_id=state.reply.pk, content=text, tool_calls=calls
        )
        publish(tool_call_event(message=message_payload(row)))
        round_messages, new = await _tools_answer(
            session=session,
            user_message_id=user_message_id,
            state=state,
            text=text,
            calls=calls,
            run=_ToolRun(
                context=context,
                enabled=enabled,
                publish=publish,
                result_cap=tool_result_cap(hard_limit_runes=window.cfg.effective_hard_limit_runes),
            ),
        )
        window.rounds.append(round_messages)
        state.reply = new


@dataclass(slots=True, frozen=True)
class _ToolRun:
    context: ToolContext
    enabled: dict[str, Tool]
    publish: Publish
    # The most of one result that is stored and sent (tool_result_cap).
    result_cap: int


# A result's share of the session's hard limit, and the least it is cut to.
TOOL_RESULT_SHARE = 4
TOOL_RESULT_MIN_RUNES = 2_000


def tool_result_cap(*, hard_limit_runes: int) -> int:
    """The most of one tool result that is kept: a quarter of the hard limit. A workspace file
    of a megabyte read whole went to the model whole, three times in three rounds (a million
    runes a call against a 48,000-rune limit: the operator's model spent far past what the
    operator allows)."""
    return max(TOOL_RESULT_MIN_RUNES, hard_limit_runes // TOOL_RESULT_SHARE)


def tool_result_cut(result: str, *, cap: int) -> str:
    if len(result) <= cap:
        return result
    return f"{result[:cap]}\n…[cut: {len(result) - cap} more characters; ask for a part of it]"


async def _tools_answer(
    *,
    session: ChatSession,
    user_message_id: int | None,
    state: RoundsState,
    text: str,
    calls: list[dict[str, Any]],
    run: _ToolRun,
) -> tuple[list[Message], ChatMessage]:
    """Run one round's tool calls, storing and publishing each result, then complete the
    tool-call row and open the next round's. Returns the round's messages for the next call,
    and the new reply row. Cancelled midway, every unanswered call gets a result and the row
    is marked cancelled (a provider rejects a call without one in later payloads)."""
    round_messages: list[Message] = [{"role": "assistant", "content": text, "tool_calls": calls}]
    answered: set[str] = set()
    try:
        for call in calls:
            result = await _tool_answer(session=session, state=state, call=call, run=run)
            answered.add(call["id"])
            round_messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        _done, new = await in_worker(reply_round_next)(
            message_id=state.reply.pk,
            session_id=session.pk,
            reply_to=user_message_id,
            tool_round=state.tool_rounds,
        )
    except asyncio.CancelledError:
        missing = [c["id"] for c in calls if c["id"] not in answered]
        await asyncio.shield(
            in_worker(reply_round_cancel)(
                message_id=state.reply.pk, session_id=session.pk, missing_call_ids=missing
            )
        )
        raise
    return round_messages, new


async def _tool_answer(
    *, session: ChatSession, state: RoundsState, call: dict[str, Any], run: _ToolRun
) -> str:
    """One tool call: run it, store its `tool` row, publish it; its result text."""
    started = time.monotonic()
    result, is_error = await in_worker(tool_run)(
        tool_call=call, context=run.context, enabled=run.enabled
    )
    result = tool_result_cut(result, cap=run.result_cap)
    tool_row = await in_worker(tool_message_create)(
        session_id=session.pk, role=MessageRole.TOOL, content=result, tool_call_id=call["id"]
    )
    logger.info(
        "chat_agent_tool_call session=%s round=%d tool=%s error=%s result_runes=%d duration_ms=%d",
        session.pk,
        state.tool_rounds,
        call["function"]["name"],
        is_error,
        len(result),
        int((time.monotonic() - started) * 1000),
    )
    run.publish(
        tool_result_event(
            message=message_payload(tool_row), tool=call["function"]["name"], is_error=is_error
        )
    )
    return result
