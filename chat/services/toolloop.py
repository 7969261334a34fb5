"""The reply's model rounds: `RunAgentToolLoop` (SPEC §5), implemented by `agent_tool_loop_run`.

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
have run, so "one reply at a time" (chat.services.messages) holds through the whole loop.

Checkpoints: tool results enter the model context in full. When the loop's own payload (the
turn's context + this turn's round trips) passes the session's threshold (`threshold_pct` of
the input budget, with the agent's context overrides), the earlier round trips of this turn are
replaced, in the payload only, by one LLM checkpoint summary; the latest round stays verbatim.
Logs: `chat_agent_context_compact_llm` (done), `chat_agent_context_compact_llm_failed` (then
the oldest round trips are left out of that one call instead) and
`chat_agent_context_compact_skipped` (over the threshold with nothing earlier to fold). Stored
messages are never changed; the session's rolling summary is a separate mechanism.

Contract with chat.services.reply (keep it when extending):
- `reply_rounds_run` is awaited once per reply, after the payload is built (again, with the same
  state, when the provider refused the context and the session was compacted).
- It streams each model call with `stream_round(messages=..., message_id=..., tools=...)`, which
  emits `delta` events for `message_id`, saves progress, and returns (text, finish) where
  finish has "finish_reason", "usage" and "tool_calls" (OpenAI format list, possibly empty).
- `state.message_id` always names the assistant row currently being written, so the caller can
  mark the right row failed/cancelled when a round raises (LLMError, CancelledError...).
- It returns the id of the final assistant row, its text and the last finish dict.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from cadau.contextconfig import ContextConfig
from chat.llm import get_provider
from chat.llm.base import SUMMARY_MARKER, LLMError, Message
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.services.agents import agent_settings, agent_tools
from chat.services.context import (
    SummaryRejected,
    context_config_for,
    message_runes,
    summary_validate,
)
from chat.services.messages import message_payload, tool_message_create
from chat.services.workers import in_worker
from chat.tools import Tool, ToolContext, tool_run

logger = logging.getLogger("chat.toolloop")

StreamRound = Callable[..., Awaitable[tuple[str, dict[str, Any]]]]
Emit = Callable[[dict[str, Any]], Awaitable[None]]

CHECKPOINT_PREFIX = "[Checkpoint of my earlier tool work on this request]"
# What the checkpoint summariser is given per tool result and in all: a 1 MB file read must
# not make the checkpoint call itself overflow.
CHECKPOINT_RESULT_MAX_RUNES = 20_000
CHECKPOINT_MIN_RUNES = 500
CANCELLED_RESULT = "Error: cancelled before this tool ran."


@dataclass(slots=True)
class RoundsState:
    message_id: int
    # Model calls made for this reply, and how many of them ended in tool calls (the round
    # limit counts these, across a context-error retry of the whole loop).
    rounds: int = 0
    tool_rounds: int = 0


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
    tools = agent_tools(agent=session.agent)
    if not tools:
        text, finish = await stream_round(
            messages=messages, message_id=state.message_id, tools=None
        )
        state.rounds += 1
        return RoundsResult(message_id=state.message_id, text=text, finish=finish)
    return await agent_tool_loop_run(
        session=session,
        state=state,
        messages=messages,
        stream_round=stream_round,
        emit=emit,
        tools=tools,
    )


# --------------------------------------------------------------------------------------------
# Sync services: the rows of a tool round
# --------------------------------------------------------------------------------------------


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
            metadata={"reply_to": reply_to, "tool_round": tool_round + 1},
            created_at=now,
        )
        ChatSession.objects.filter(pk=session_id).update(
            message_count=F("message_count") + 1, last_activity_at=now
        )
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


def _reply_to(message_id: int) -> int | None:
    row = ChatMessage.objects.only("metadata").get(pk=message_id)
    value = row.metadata.get("reply_to") if isinstance(row.metadata, dict) else None
    return value if isinstance(value, int) else None


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

CHECKPOINT_SYSTEM_PROMPT = f"""{SUMMARY_MARKER}
You write the checkpoint of an assistant's work in progress on the user's current request: which
tools it called and what they returned that matters (copy exact numbers, names, paths, ids and
error messages), what is already done and what remains to do. Write in the conversation's
language. Reply with the checkpoint only."""


def _runes(messages: Sequence[Message]) -> int:
    return sum(
        message_runes(content=str(m.get("content") or ""), tool_calls=m.get("tool_calls"))
        for m in messages
    )


def _render_round(round_messages: Sequence[Message]) -> str:
    lines = []
    for m in round_messages:
        if m.get("role") == "assistant":
            calls = [
                f"{c['function']['name']}({c['function']['arguments']})"
                for c in m.get("tool_calls") or []
            ]
            text = str(m.get("content") or "").strip()
            lines.append(f"assistant: {text}\n→ calls: {'; '.join(calls)}".strip())
        else:
            content = str(m.get("content") or "")
            if len(content) > CHECKPOINT_RESULT_MAX_RUNES:
                content = content[:CHECKPOINT_RESULT_MAX_RUNES] + " …[cut for the checkpoint]"
            lines.append(f"tool result ({m.get('tool_call_id')}): {content}")
    return "\n".join(lines)


def checkpoint_summarise(
    *, question: str, previous: str, rounds: Sequence[Sequence[Message]], cap: int, input_cap: int
) -> str:
    """One summarising call over this turn's earlier round trips. Raises LLMError or
    SummaryRejected; never returns an unusable checkpoint."""
    provider = get_provider()
    trips = "\n\n".join(_render_round(r) for r in rounds)
    if len(trips) > input_cap:
        trips = "…[older part cut]\n" + trips[-input_cap:]
    user = (
        f"The user's request:\n{question or '(unknown)'}\n\n"
        f"Previous checkpoint (may be empty):\n{previous or '(none)'}\n\n"
        f"Tool round trips since then:\n{trips}\n\n"
        f"Return the updated checkpoint in at most {cap} characters."
    )
    result = provider.complete(
        messages=[
            {"role": "system", "content": CHECKPOINT_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ],
        model=provider.summary_model,
        max_tokens=cap,
        temperature=0.2,
    )
    return summary_validate(text=result.text, cap=cap)


@dataclass(slots=True)
class LoopWindow:
    """What the model sees during the loop: the turn's payload, an optional checkpoint standing
    for `rounds[:covered]`, and the remaining round trips verbatim."""

    session_id: int
    base: list[Message]
    cfg: ContextConfig
    rounds: list[list[Message]] = field(default_factory=list)
    checkpoint: str = ""
    covered: int = 0
    checkpoints: int = 0

    @property
    def threshold(self) -> int:
        return self.cfg.threshold_runes

    @property
    def question(self) -> str:
        for m in reversed(self.base):
            if m.get("role") == "user":
                return str(m.get("content") or "")
        return ""

    def assemble(
        self, *, kept: Sequence[Sequence[Message]] | None = None, note: str = ""
    ) -> list[Message]:
        out = list(self.base)
        if self.checkpoint:
            out.append({"role": "assistant", "content": f"{CHECKPOINT_PREFIX}\n{self.checkpoint}"})
        if note:
            out.append({"role": "assistant", "content": note})
        for round_messages in self.rounds[self.covered :] if kept is None else kept:
            out.extend(round_messages)
        return out

    def messages_for_call(self) -> list[Message]:
        """Sync (it may make the checkpoint call): run it in a worker thread."""
        messages = self.assemble()
        before = _runes(messages)
        if before <= self.threshold:
            return messages
        foldable = self.rounds[self.covered : -1]
        if not foldable:
            logger.info(
                "chat_agent_context_compact_skipped session=%s runes=%d threshold=%d rounds=%d "
                "reason=nothing_earlier_to_fold",
                self.session_id,
                before,
                self.threshold,
                len(self.rounds),
            )
            return messages
        cap = max(CHECKPOINT_MIN_RUNES, min(self.cfg.summary_max_runes, self.threshold // 4))
        input_cap = max(4000, self.cfg.input_budget_runes - cap)
        started = time.monotonic()
        try:
            checkpoint = checkpoint_summarise(
                question=self.question[:4000],
                previous=self.checkpoint,
                rounds=foldable,
                cap=cap,
                input_cap=input_cap,
            )
        except (LLMError, SummaryRejected) as exc:
            return self._fallback(before=before, error=f"{type(exc).__name__}: {exc}")
        self.checkpoint = checkpoint
        self.covered = len(self.rounds) - 1
        self.checkpoints += 1
        messages = self.assemble()
        logger.info(
            "chat_agent_context_compact_llm session=%s rounds_folded=%d runes_before=%d "
            "runes_after=%d threshold=%d checkpoint_runes=%d duration_ms=%d",
            self.session_id,
            len(foldable),
            before,
            _runes(messages),
            self.threshold,
            len(checkpoint),
            int((time.monotonic() - started) * 1000),
        )
        return messages

    def _fallback(self, *, before: int, error: str) -> list[Message]:
        """No checkpoint: leave the oldest round trips out of this one call (never the latest),
        with a note saying so. The next call tries a checkpoint again."""
        kept = list(self.rounds[self.covered :])
        dropped = 0

        def note() -> str:
            if not dropped:
                return ""
            return f"[{dropped} earlier tool round(s) of this request left out: context budget]"

        while len(kept) > 1 and _runes(self.assemble(kept=kept, note=note())) > self.threshold:
            kept.pop(0)
            dropped += 1
        messages = self.assemble(kept=kept, note=note())
        logger.warning(
            "chat_agent_context_compact_llm_failed session=%s runes_before=%d runes_after=%d "
            "threshold=%d rounds_dropped=%d error=%s",
            self.session_id,
            before,
            _runes(messages),
            self.threshold,
            dropped,
            error[:300],
        )
        return messages


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


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
    state: RoundsState,
    messages: list[Message],
    stream_round: StreamRound,
    emit: Emit,
    tools: list[Tool],
) -> RoundsResult:
    """RunAgentToolLoop: see the module docstring."""
    agent = session.agent
    assert agent is not None  # agent_tools() is empty without one
    max_rounds = agent_settings(agent=agent).max_tool_rounds
    specs = [tool.as_openai() for tool in tools]
    enabled = {tool.name: tool for tool in tools}
    reply_to = await database_sync_to_async(_reply_to)(state.message_id)
    context = ToolContext(
        agent_id=agent.pk,
        session_id=session.pk,
        user_id=session.owner_id,
        user_message_id=reply_to,
    )
    window = LoopWindow(
        session_id=session.pk, base=list(messages), cfg=context_config_for(session=session)
    )
    while True:
        offer = state.tool_rounds < max_rounds
        call_messages = await in_worker(window.messages_for_call)()
        text, finish = await stream_round(
            messages=call_messages, message_id=state.message_id, tools=specs if offer else None
        )
        state.rounds += 1
        calls = _normalised_calls(finish.get("tool_calls") or [], message_id=state.message_id)
        if calls and not offer:
            logger.warning(
                "chat_agent_tool_round_limit session=%s rounds=%d ignored_calls=%d",
                session.pk,
                state.tool_rounds,
                len(calls),
            )
        if not calls or not offer:
            return RoundsResult(message_id=state.message_id, text=text, finish=finish)
        state.tool_rounds += 1
        row = await database_sync_to_async(reply_tool_calls_set)(
            message_id=state.message_id, content=text, tool_calls=calls
        )
        await emit({"type": "tool_call", "message": message_payload(row)})
        round_messages: list[Message] = [
            {"role": "assistant", "content": text, "tool_calls": calls}
        ]
        answered: set[str] = set()
        try:
            for call in calls:
                started = time.monotonic()
                result, is_error = await in_worker(tool_run)(
                    tool_call=call, context=context, enabled=enabled
                )
                tool_row = await database_sync_to_async(tool_message_create)(
                    session_id=session.pk,
                    role=MessageRole.TOOL,
                    content=result,
                    tool_call_id=call["id"],
                )
                answered.add(call["id"])
                logger.info(
                    "chat_agent_tool_call session=%s round=%d tool=%s error=%s result_runes=%d "
                    "duration_ms=%d",
                    session.pk,
                    state.tool_rounds,
                    call["function"]["name"],
                    is_error,
                    len(result),
                    int((time.monotonic() - started) * 1000),
                )
                await emit(
                    {
                        "type": "tool_result",
                        "message": message_payload(tool_row),
                        "tool": call["function"]["name"],
                        "is_error": is_error,
                    }
                )
                round_messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )
            _done, new = await database_sync_to_async(reply_round_next)(
                message_id=state.message_id,
                session_id=session.pk,
                reply_to=reply_to,
                tool_round=state.tool_rounds,
            )
        except asyncio.CancelledError:
            missing = [c["id"] for c in calls if c["id"] not in answered]
            await asyncio.shield(
                database_sync_to_async(reply_round_cancel)(
                    message_id=state.message_id, session_id=session.pk, missing_call_ids=missing
                )
            )
            raise
        window.rounds.append(round_messages)
        state.message_id = new.pk
