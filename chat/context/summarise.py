"""The summarising call: one place that asks the summary model to condense a transcript, used by
compaction (the session summary), the tool loop's checkpoints (chat/turn/checkpoint.py) and
memory extraction (agentmemory/flush.py). Each caller brings its own instructions and checks
the answer; they share the request, the call count and the transcript format."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from chat.llm import get_provider, slots
from chat.llm.base import Completion
from chat.llm.window import tokens_learn
from chat.workers import background_yield

logger = logging.getLogger("chat.context")


class SummaryRejected(Exception):
    """The model answered, but not with something usable as a summary."""


@dataclass(slots=True)
class CallCounter:
    calls: int = 0


class TranscriptMessage(Protocol):
    # Read-only, so frozen dataclasses (TailMessage) fit.
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def tool_calls(self) -> Any: ...


def transcript_text(message: TranscriptMessage, *, clip: int | None = None) -> str:
    """A message's text with the tool calls it makes, cut to `clip` characters: what every
    summarising call and the daily notes show of a message."""
    text = message.content or ""
    calls = message.tool_calls if isinstance(message.tool_calls, list) else []
    if calls:
        rendered = []
        for call in calls:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            rendered.append(f"{function.get('name', '?')}({function.get('arguments', '')})")
        text = f"{text}\n→ tool calls: {'; '.join(rendered)}".strip()
    if clip is not None and len(text) > clip:
        text = f"{text[:clip]} …[{len(text) - clip} more characters]"
    return text


def transcript_render(messages: Iterable[TranscriptMessage], *, clip: int | None = None) -> str:
    """`[#id role] text` per message (the id where the message has one; a tool result names
    the call it answers), one blank line apart."""
    lines = []
    for m in messages:
        label = m.role
        call_id = getattr(m, "tool_call_id", "")
        if m.role == "tool" and call_id:
            label = f"tool result for {call_id}"
        message_id = getattr(m, "id", None)
        if message_id is not None:
            label = f"#{message_id} {label}"
        lines.append(f"[{label}] {transcript_text(m, clip=clip)}")
    return "\n\n".join(lines)


def summarise_call(
    *,
    instructions: str,
    content: str,
    max_tokens: int,
    temperature: float = 0.2,
    counter: CallCounter | None = None,
) -> Completion:
    """One call to the summary model. Raises LLMError. `counter` counts it, failed or not."""
    provider = get_provider()
    if counter is not None:
        counter.calls += 1
    if not slots.background_turn():
        logger.info("chat_summary_not_idle: a one-slot server was never idle; calling anyway")
    # A send on its way to its first token goes to the model first (a summary's prompt is ~50
    # KB for the model server to read before it answers anyone else).
    background_yield()
    result = provider.complete(
        messages=[
            {"role": "system", "content": instructions},
            {"role": "user", "content": content},
        ],
        model=provider.summary_model,
        max_tokens=max_tokens,
        temperature=temperature,
    )
    reported = result.usage.prompt_tokens if result.usage else None
    if reported and not provider.is_offline:
        # Whole completions carry usage even where streams do not (llama-cpp-python ignores
        # stream_options): the summary calls are where the tokenizer is learned then.
        tokens_learn(model=provider.summary_model, text=instructions + content, reported=reported)
    return result


_ERRORISH = re.compile(
    r"^\s*(error\b|exception\b|traceback\b|internal server error|i'?m sorry|sorry, i can|"
    r"as an ai\b|i cannot\b|i can't\b|\{\s*\"error\")",
    re.IGNORECASE,
)


def looks_like_error(text: str) -> bool:
    """An error message or a refusal where a summary should be."""
    return bool(_ERRORISH.search(text[:200])) or "context_length_exceeded" in text


def summary_answer_problem(*, text: str, cap: int) -> str | None:
    """Why a model's answer cannot be a summary at all (empty, an error, over its cap), or
    None. The session summary falls back on it (chat/context/merge.py); checkpoints and memory
    extraction refuse it (`summary_validate`)."""
    cleaned = text.strip()
    if not cleaned:
        return "empty summary"
    if looks_like_error(cleaned):
        return f"summary looks like an error: {cleaned[:80]!r}"
    if len(cleaned) > cap:
        return f"summary has {len(cleaned)} runes, over the cap of {cap}"
    return None


def summary_validate(*, text: str, cap: int) -> str:
    """`text` stripped, or SummaryRejected with `summary_answer_problem`'s reason."""
    problem = summary_answer_problem(text=text, cap=cap)
    if problem is not None:
        raise SummaryRejected(problem)
    return text.strip()
