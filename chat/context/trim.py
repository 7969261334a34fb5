"""Fitting one call's payload under its limit without touching what is stored: whole turns are
left out oldest first, down to the minimum verbatim tail (`min_verbatim` messages); if even
that does not fit, its long messages other than the user's new one are shortened for this call
(head and tail kept, a marker between), and only then are its older turns left out too. A
payload fails only when the user's newest message alone cannot fit beside the system prompt.

Limits are in runes (the rune budget) or, where the model's window binds, in estimated tokens
message by message (a turn in a cheaper script fits where the conversation's average says it
does not)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from chat.context.cut import turn_starts
from chat.context.prompt import system_text
from chat.context.state import ContextState, TailMessage, message_runes
from chat.llm.window import tokens_estimate
from chat.models import MessageRole

# Tokens a chat template adds around each message (SmolLM2's "<|im_start|>user\n" ...
# "<|im_end|>\n" is 5): the learned factors only partly absorb them.
MESSAGE_OVERHEAD_TOKENS = 5
# What a shortened message says where its middle was: the model should know text is missing
# (and not quote around the gap as if it were whole); the stored row is unchanged.
SHORTENED_MARKER = "\n…[{n} characters of this message left out here]…\n"
# A shortened message keeps at least this many of its characters, head and tail together.
MIN_KEPT_RUNES = 200


class PayloadTooLarge(Exception):
    """Even the user's newest message alone does not fit under the limit."""


@dataclasses.dataclass(frozen=True, slots=True)
class Trimmed:
    tail: list[TailMessage]
    # Messages of the tail left out of this call (oldest first) and messages shortened in it.
    dropped: int
    shortened: int


def _shortened(m: TailMessage, keep: int) -> TailMessage:
    """`m` with its middle left out: `keep` characters, half from its head, half its end."""
    head = keep // 2
    content = (
        m.content[:head]
        + SHORTENED_MARKER.format(n=len(m.content) - keep)
        + m.content[len(m.content) - (keep - head) :]
    )
    return dataclasses.replace(
        m, content=content, runes=message_runes(content=content, tool_calls=m.tool_calls)
    )


def _shorten(
    msgs: Sequence[TailMessage], *, room: int, measure: Callable[[TailMessage], int]
) -> tuple[list[TailMessage], int] | None:
    """`msgs` with their longest messages (never the last user message: the one being
    answered) shortened until they measure at most `room`; with how many were. None when
    shortening cannot get there."""
    kept = list(msgs)
    asked = max((j for j, m in enumerate(kept) if m.role == MessageRole.USER), default=-1)
    sizes = [measure(m) for m in kept]
    done = {asked}
    shortened: set[int] = set()
    while sum(sizes) > room:
        open_ = [j for j in range(len(kept)) if j not in done]
        if not open_:
            return None
        j = max(open_, key=lambda k: sizes[k])
        m = kept[j]
        marker = len(SHORTENED_MARKER.format(n=len(m.content)))
        per_rune = sizes[j] / max(len(m.content), 1)
        excess = sum(sizes) - room
        keep = (
            max(MIN_KEPT_RUNES, len(m.content) - int(excess / per_rune) - marker - 1)
            if per_rune > 0
            else len(m.content)
        )
        if keep + marker >= len(m.content):
            done.add(j)  # too short to gain anything (or all tool-call arguments)
            continue
        kept[j] = _shortened(m, keep)
        sizes[j] = measure(kept[j])
        shortened.add(j)
    return kept, len(shortened)


def _fit(
    *,
    tail: Sequence[TailMessage],
    system: int,
    measure: Callable[[TailMessage], int],
    limit: int,
    min_verbatim: int,
) -> Trimmed | None:
    sizes = [measure(m) for m in tail]
    suffix = [0] * (len(sizes) + 1)
    for i in range(len(sizes) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + sizes[i]
    if system + suffix[0] <= limit:
        return Trimmed(tail=list(tail), dropped=0, shortened=0)
    starts = turn_starts(tail) or [0]
    floor = max((i for i in starts if len(tail) - i >= min_verbatim), default=starts[0])
    for i in starts:
        if i <= floor and system + suffix[i] <= limit:
            return Trimmed(tail=list(tail[i:]), dropped=i, shortened=0)
    for i in (s for s in starts if s >= floor):
        fitted = _shorten(tail[i:], room=limit - system, measure=measure)
        if fitted is not None:
            return Trimmed(tail=fitted[0], dropped=i, shortened=fitted[1])
    return None


def trim_to_fit(*, state: ContextState, limit: int) -> Trimmed:
    """The tail of `state` fitted under `limit` runes. Raises PayloadTooLarge."""
    fitted = _fit(
        tail=state.tail,
        system=state.system_runes,
        measure=lambda m: m.runes,
        limit=limit,
        min_verbatim=state.cfg.min_verbatim,
    )
    if fitted is None:
        raise PayloadTooLarge(
            f"the newest message needs {state.system_runes + _newest_user(state.tail).runes} "
            f"runes with the system prompt, over the hard limit of {limit}"
        )
    return fitted


def trim_to_window(*, state: ContextState) -> Trimmed:
    """The tail of `state` fitted under the tokens the model's window leaves for the prompt.
    Raises PayloadTooLarge."""
    model = state.model

    def tokens(m: TailMessage) -> int:
        calls = tokens_estimate(str(m.tool_calls), model=model) if m.tool_calls else 0
        return tokens_estimate(m.content, model=model) + calls + MESSAGE_OVERHEAD_TOKENS

    system = system_text(system_prompt=state.system_prompt, summary=state.summary)
    system_tokens = tokens_estimate(system, model=model) + MESSAGE_OVERHEAD_TOKENS
    limit = state.input_tokens
    fitted = _fit(
        tail=state.tail,
        system=system_tokens,
        measure=tokens,
        limit=limit,
        min_verbatim=state.cfg.min_verbatim,
    )
    if fitted is None:
        needed = system_tokens + tokens(_newest_user(state.tail))
        raise PayloadTooLarge(
            f"the newest message needs about {needed} tokens with the system prompt, over the "
            f"{limit} the model's window leaves for the prompt"
        )
    return fitted


def _newest_user(tail: Sequence[TailMessage]) -> TailMessage:
    users = [m for m in tail if m.role == MessageRole.USER]
    return users[-1] if users else tail[-1]
