"""The messages of a model call: the system prompt with the summary, then the verbatim tail
(whose last message is the user's new one), under the hard limit."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from chat.context.commit import CompactionResult
from chat.context.compose import Recaller, payload_compose
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
    # Messages recall quoted into this call (chat/context/compose.py).
    recalled: int = 0


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


def context_payload_build(*, state: ContextState, recall: Recaller | None = None) -> Payload:
    """The payload of `state`: with `recall`, composed to fill the budget with what matches the
    new message (chat/context/compose.py); else, or when that does not fit, the summary and
    the tail trimmed (oldest turns first) to the hard limit if it must be: a failed summary
    never fails a send. Raises PayloadTooLarge when nothing can make it fit."""
    if recall is not None and state.cfg.strategy == "cadau":
        composed = _composed(state=state, recall=recall)
        if composed is not None:
            return composed
    try:
        return _payload_build(state=state)
    except PayloadTooLarge:
        if not state.summary and state.prompt.text("") == state.system_prompt:
            raise
    # Older material yields to the user's message, as context_check_fits, which let the message
    # in, measured it without them: first the prompt's parts rendered for this message, then
    # the summary, cut (for this call only) to half, a quarter, nothing. A session never
    # becomes unsendable because its summary grew; the next compaction writes it smaller.
    state = dataclasses.replace(state, system_prompt=state.prompt.text(""))
    logger.info("chat_context_older_material_yielded session=%s", state.session.pk)
    summary = state.summary
    for share in (1.0, 0.5, 0.25, 0.0):
        cut = summary_cut(summary, runes=int(len(summary) * share))
        try:
            return _payload_build(state=dataclasses.replace(state, summary_for_call=cut))
        except PayloadTooLarge:
            if not cut:
                raise
    raise AssertionError("unreachable: the last try has no summary")


def summary_cut(summary: str, *, runes: int) -> str:
    """The summary's first whole lines within `runes` (its headings and oldest facts come
    first); "" when not even one fits."""
    if len(summary) <= runes:
        return summary
    kept: list[str] = []
    used = 0
    for line in summary.splitlines():
        if used + len(line) + 1 > runes:
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept).strip()


def _composed(*, state: ContextState, recall: Recaller) -> Payload | None:
    """The composed payload, or None where it does not apply or would not fit the model's
    window by its own estimate (recall yields first: the plain payload is built instead)."""
    system = system_text(system_prompt=state.system_prompt, summary=state.summary)
    limit = min(state.cfg.input_budget_runes, state.cfg.effective_hard_limit_runes)
    composed = payload_compose(state=state, system=system, limit=limit, recall=recall)
    if composed is None:
        return None
    tail = _without_orphan_tool_results(composed.tail)
    if state.binding == "window" and state.input_tokens:
        tokens = sum(
            tokens_estimate(text, model=state.model) + MESSAGE_OVERHEAD_TOKENS
            for text in [composed.system, *(m.content for m in tail)]
        )
        if tokens > state.input_tokens:
            return None
    messages: list[Message] = [{"role": "system", "content": composed.system}]
    messages.extend(m.as_openai() for m in tail)
    return Payload(
        messages=messages,
        runes=len(composed.system) + sum(m.runes for m in tail),
        limit_runes=state.cfg.input_budget_runes,
        dropped=0,
        rows_read=state.rows_read,
        recalled=composed.recalled,
    )


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
    # The prompt as rendered for no particular message, without the summary: what depends on
    # the message and the summary are older material that yields when the message needs the
    # room (context_payload_build), so they must not refuse a message that fits without them.
    # A part that is there either way (long-term memory) renders "" within the same cap, so
    # it is measured at a comparable size.
    system = prompt.text("")
    needed = len(system) + len(content)
    if needed > cfg.effective_hard_limit_runes:
        raise MessageTooLarge(
            f"This message is too long for the model's context: it needs about {needed} "
            f"characters with the system prompt; the limit is "
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
            f"tokens with the system prompt; the model leaves {room} for the "
            "prompt. Shorten it or split it."
        )
