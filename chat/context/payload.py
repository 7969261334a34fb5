"""The messages of a model call: the system prompt with the summary, then the verbatim tail
(whose last message is the user's new one), under the hard limit."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from chat.context.commit import CompactionResult
from chat.context.prompt import SystemPrompt, context_config_for, session_model, system_text
from chat.context.state import ContextState, TailMessage
from chat.context.trim import (
    MESSAGE_OVERHEAD_TOKENS,
    PayloadTooLarge,
    trim_to_fit,
    trim_to_window,
)
from chat.errors import MessageTooLarge
from chat.llm.base import Message
from chat.llm.window import reply_reserve_tokens, tokens_estimate, window_learned_get
from chat.models import ChatSession, MessageRole

logger = logging.getLogger("chat.context")


@dataclass(slots=True)
class Payload:
    messages: list[Message]
    runes: int
    limit_runes: int
    # Verbatim messages left out of this one call because the summary could not absorb them.
    dropped: int
    rows_read: int
    compactions: list[CompactionResult] = field(default_factory=list)


def _without_orphan_tool_results(tail: list[TailMessage]) -> list[TailMessage]:
    """Providers reject a tool result whose assistant call is not in the payload. Our cuts never
    separate them, but the seed's fixed-size batches do, and so could a hand-edited anchor."""
    open_calls: set[str] = set()
    kept = []
    for m in tail:
        if m.role == MessageRole.ASSISTANT and m.tool_calls:
            open_calls.update(str(c.get("id")) for c in m.tool_calls if isinstance(c, dict))
        if m.role == MessageRole.TOOL and m.tool_call_id not in open_calls:
            continue
        kept.append(m)
    return kept


def context_payload_build(*, state: ContextState) -> Payload:
    """The payload of `state`, trimmed (oldest turns first) to the hard limit if it must be:
    a failed summary never fails a send. Raises PayloadTooLarge when nothing can make it fit."""
    try:
        return _payload_build(state=state)
    except PayloadTooLarge:
        plain = state.prompt.text("")
        if plain == state.system_prompt:
            raise
    # The prompt's parts rendered for this message (automatic recall) leave the user's message
    # no room: they are extras and yield, as context_check_fits, which let the message in,
    # measured the prompt without them.
    logger.info("chat_context_prompt_parts_yielded session=%s", state.session.pk)
    return _payload_build(state=dataclasses.replace(state, system_prompt=plain))


def _payload_build(*, state: ContextState) -> Payload:
    limit = state.cfg.effective_hard_limit_runes
    if state.binding == "window" and state.input_tokens:
        trimmed = trim_to_window(state=state)
    else:
        trimmed = trim_to_fit(state=state, limit=limit)
    dropped = trimmed.dropped
    if dropped or trimmed.shortened:
        logger.warning(
            "chat_context_payload_trimmed session=%s dropped=%d shortened=%d runes=%d limit=%d",
            state.session.pk,
            dropped,
            trimmed.shortened,
            state.runes,
            state.input_tokens or limit,
        )
    tail = _without_orphan_tool_results(trimmed.tail)
    system = system_text(system_prompt=state.system_prompt, summary=state.summary)
    messages: list[Message] = [{"role": "system", "content": system}]
    messages.extend(m.as_openai() for m in tail)
    return Payload(
        messages=messages,
        runes=len(system) + sum(m.runes for m in tail),
        limit_runes=state.cfg.input_budget_runes,
        dropped=dropped,
        rows_read=state.rows_read,
    )


def context_check_fits(*, session: ChatSession, prompt: SystemPrompt, content: str) -> None:
    """Refuse, before anything is stored, a message that cannot fit even alone with the system
    prompt and the summary: under the hard limit in runes, and, once the model's window is
    known, in the tokens it leaves for the prompt. Compaction could never make room for it."""
    cfg = context_config_for(session=session)
    # The prompt as rendered for no particular message: a part that depends on the message
    # (automatic recall, chat/search/recall.py) is an extra that yields when the message needs
    # the room (context_payload_build), so it must not refuse a message that fits without it.
    # A part that is there either way (long-term memory) renders "" within the same cap, so
    # it is measured at a comparable size.
    system = system_text(system_prompt=prompt.text(""), summary=session.context_summary)
    needed = len(system) + len(content)
    if needed > cfg.effective_hard_limit_runes:
        raise MessageTooLarge(
            f"This message is too long for the model's context: it needs about {needed} "
            f"characters with the system prompt and summary; the limit is "
            f"{cfg.effective_hard_limit_runes}."
        )
    model = session_model(session=session)
    window = cfg.window_tokens or window_learned_get(model=model)
    if not window:
        return
    room = window - reply_reserve_tokens(window)
    tokens = (
        tokens_estimate(system, model=model)
        + tokens_estimate(content, model=model)
        + 2 * MESSAGE_OVERHEAD_TOKENS
    )
    if tokens > room:
        raise MessageTooLarge(
            f"This message is too long for the model's context window: it needs about {tokens} "
            f"tokens with the system prompt and summary; the model leaves {room} for the "
            "prompt. Shorten it or split it."
        )
