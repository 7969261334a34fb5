"""The session summary: merging a chunk of transcript into the summary in force, guarded.

One model call asks for the merged summary (`SUMMARY_SYSTEM_PROMPT`). The answer must pass
`summary_validate` (not an error, within the cap; else SummaryRejected and nothing moves) and
the summary guard (chat/context/guard.py: not empty or reasoning only, no echo, shorter than
what it replaces, headings kept). A guard failure is retried once with the failure spelled
out, then the extractive fallback is used, so a model that cannot summarise never stalls
compaction and never loses an identifier.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cadau.contextconfig import ContextConfig
from chat.context.guard import (
    FALLBACK_MODEL,
    SUMMARY_HEADINGS,
    summary_extractive,
    summary_problem,
    summary_retry_note,
)
from chat.context.heading import summary_prefix_strip
from chat.context.summarise import (
    CallCounter,
    TranscriptMessage,
    looks_like_error,
    summarise_call,
    summary_validate,
    transcript_render,
    transcript_text,
)
from chat.llm.base import SUMMARY_MARKER, SUMMARY_SCAFFOLD, ContextLengthExceeded, EmptyStream
from chat.llm.window import reply_reserve_tokens

logger = logging.getLogger("chat.context")

_HEADINGS_LIST = "\n".join(f"## {heading}" for heading in SUMMARY_HEADINGS)

SUMMARY_SYSTEM_PROMPT = f"""{SUMMARY_MARKER}
You maintain the running summary of a long conversation between a user and an assistant. Merge
the new transcript excerpt into the existing summary. Write in the conversation's language, but
keep these section headings exactly as written, in this order, as Markdown headings:
{_HEADINGS_LIST}
Under "{SUMMARY_HEADINGS[-1]}" copy names, numbers, file paths, URLs, commands and code
identifiers exactly as written. Drop small talk. Never invent anything. Reply with the summary
only."""

_EXISTING, _EXCERPT, _RETURN, _EXTRA, _SHORTEN = SUMMARY_SCAFFOLD


def _request(
    *, previous: str, messages: Sequence[TranscriptMessage], cap: int, instructions: str
) -> str:
    user = (
        f"{_EXISTING}\n{previous or '(none)'}\n\n"
        f"{_EXCERPT}\n{transcript_render(messages)}\n\n"
        f"{_RETURN} {cap} characters."
    )
    if instructions:
        user += f"\n\n{_EXTRA} {instructions}"
    return user


def summary_merge(
    *,
    previous: str,
    messages: Sequence[TranscriptMessage],
    cfg: ContextConfig,
    instructions: str = "",
    counter: CallCounter | None = None,
) -> tuple[str, str]:
    """Merge `messages` into the summary `previous`. Returns (summary, model); model is
    FALLBACK_MODEL when the guard rejected the model twice. Raises LLMError or SummaryRejected;
    never returns an unusable summary."""
    counter = counter if counter is not None else CallCounter()
    cap = cfg.summary_cap_runes
    user = _request(previous=previous, messages=messages, cap=cap, instructions=instructions)
    replaced = len(previous) + sum(len(transcript_text(m)) for m in messages)
    # The length limit is asked in the prompt and enforced on the result. max_tokens only guards
    # against runaway output: a token is at least one rune, so this never truncates a summary
    # that respects the cap (truncation would cut off the identifiers section at the end).
    max_tokens = cap
    if cfg.window_tokens:
        # The answer must fit the model's window beside the request (OpenAI-style servers
        # refuse prompt + max_tokens past it).
        max_tokens = min(max_tokens, reply_reserve_tokens(cfg.window_tokens))
    problem: str | None = None
    for attempt in (1, 2):
        content = user if problem is None else f"{user}\n\n{summary_retry_note(problem)}"
        try:
            result = summarise_call(
                instructions=SUMMARY_SYSTEM_PROMPT,
                content=content,
                max_tokens=max_tokens,
                counter=counter,
            )
        except (ContextLengthExceeded, EmptyStream) as exc:
            # The request itself is past the model's window: a stricter prompt is no smaller.
            problem = f"the request does not fit the model's window ({exc})"
            break
        # A model that sees the summary under its heading in every reply may echo the heading
        # (either language) into its answer: the heading is added when sent, never stored.
        text = summary_prefix_strip(text=result.text)
        if not text:
            # Nothing, or only reasoning (the codec takes a thinking model's <think> block out).
            problem = "it was empty (only reasoning, or nothing at all)"
            logger.warning("chat_summary_guard attempt=%d problem=%s", attempt, problem)
            continue
        if len(text) > cap and text and not looks_like_error(text):
            # Grown past its cap: compress the summary itself once rather than reject outright.
            text = summarise_call(
                instructions=SUMMARY_SYSTEM_PROMPT,
                content=(
                    f"{_SHORTEN} {cap * 9 // 10} characters. Keep the sections and every "
                    f"exact identifier.\n\n{text}"
                ),
                max_tokens=max_tokens,
                counter=counter,
            ).text
        text = summary_validate(text=text, cap=cap)
        problem = summary_problem(text=text, previous=previous, replaced_runes=replaced)
        if problem is None:
            return text, result.model
        logger.warning("chat_summary_guard attempt=%d problem=%s", attempt, problem)
    fallback = summary_extractive(previous=previous, messages=messages, max_runes=cap)
    logger.warning("chat_summary_fallback runes=%d problem=%s", len(fallback), problem)
    return fallback, FALLBACK_MODEL
