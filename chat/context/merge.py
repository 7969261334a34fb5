"""The session summary: merging a chunk of transcript into the summary in force, guarded.

One model call asks for the merged summary (`SUMMARY_SYSTEM_PROMPT`). The answer must be a
summary at all (not empty, not an error, within its cap after at most one call to shorten
it) and pass the summary guard (chat/context/guard.py). A guard failure is retried once with
the failure spelled out; an answer still unusable, or still over its cap, is replaced by the
extractive fallback (chat/context/fallback.py). So a summary never makes things worse: a
model that cannot summarise neither stalls compaction nor throws away its work, and never
loses an identifier. An accepted summary that leaves room under its cap is followed by the
fallback's sentences in that room (chat/context/digest.py): a terse one drops no fact either.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cadau.contextconfig import ContextConfig
from chat.context.digest import summary_split, summary_with_digest
from chat.context.fallback import summary_extractive
from chat.context.guard import (
    FALLBACK_MODEL,
    SUMMARY_HEADINGS,
    summary_problem,
    summary_retry_note,
)
from chat.context.heading import summary_prefix_strip
from chat.context.summarise import (
    CallCounter,
    TranscriptMessage,
    looks_like_error,
    summarise_call,
    summary_answer_problem,
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


@dataclass(frozen=True, slots=True)
class Merged:
    summary: str
    #: The model that wrote it: the summary model's name, or FALLBACK_MODEL.
    model: str
    #: Why the model's answer was not used ("" when it was): the snapshot's note.
    problem: str = ""


def summary_merge(
    *,
    previous: str,
    messages: Sequence[TranscriptMessage],
    cfg: ContextConfig,
    instructions: str = "",
    counter: CallCounter | None = None,
) -> Merged:
    """Merge `messages` into the summary `previous`. The model's answer when it passes the
    guard (at most one retry, at most one shortening call), else the extractive fallback:
    never an unusable summary, and never nothing for a model that answered. Raises LLMError
    (the server failed: nothing was learned, the next compaction tries again)."""
    counter = counter if counter is not None else CallCounter()
    cap = cfg.summary_cap_runes
    # The model merges into its own summary; the digest after it is Cadau's to carry.
    own, digest = summary_split(previous)
    user = _request(previous=own, messages=messages, cap=cap, instructions=instructions)
    check = _Check(
        previous=own,
        cap=cap,
        replaced=len(own) + sum(len(transcript_text(m)) for m in messages),
        material=f"{transcript_render(messages)}\n{instructions}",
        max_tokens=_max_tokens(cfg),
        counter=counter,
    )
    problem: str | None = None
    for attempt in (1, 2):
        content = user if problem is None else f"{user}\n\n{summary_retry_note(problem)}"
        try:
            result = summarise_call(
                instructions=SUMMARY_SYSTEM_PROMPT,
                content=content,
                max_tokens=check.max_tokens,
                counter=counter,
            )
        except (ContextLengthExceeded, EmptyStream) as exc:
            # The request itself is past the model's window: a stricter prompt is no smaller.
            problem = f"the request does not fit the model's window ({exc})"
            break
        text, problem = check.answer(result.text)
        if problem is None:
            if cfg.strategy == "cadau":  # the seed's loop is kept as the seed had it, to compare
                text = summary_with_digest(summary=text, digest=digest, messages=messages, cap=cap)
            return Merged(summary=text, model=result.model)
        logger.warning("chat_summary_guard attempt=%d problem=%s", attempt, problem)
        if check.shortened and len(text) > cap:
            break  # over its cap even when asked to shorten: a third call would be no better
    # The whole previous summary, digest included (the fallback reads past the separator).
    fallback = summary_extractive(previous=previous, messages=messages, max_runes=cap)
    logger.warning("chat_summary_fallback runes=%d problem=%s", len(fallback), problem)
    return Merged(summary=fallback, model=FALLBACK_MODEL, problem=problem or "")


def _max_tokens(cfg: ContextConfig) -> int:
    # The length limit is asked in the prompt and enforced on the result. max_tokens only guards
    # against runaway output: a token is at least one rune, so this never truncates a summary
    # that respects the cap (truncation would cut off the identifiers section at the end).
    if cfg.window_tokens:
        # The answer must fit the model's window beside the request (OpenAI-style servers
        # refuse prompt + max_tokens past it).
        return min(cfg.summary_max_runes, reply_reserve_tokens(cfg.window_tokens))
    return cfg.summary_max_runes


@dataclass(slots=True)
class _Check:
    """One merge's judge of the model's answers."""

    previous: str
    cap: int
    replaced: int
    material: str
    max_tokens: int
    counter: CallCounter
    shortened: bool = False

    def answer(self, raw: str) -> tuple[str, str | None]:
        """The answer as it would be stored, and why it may not be (None: it may)."""
        # A model that sees the summary under its heading in every reply may echo the heading
        # (either language) into its answer: the heading is added when sent, never stored.
        text = summary_prefix_strip(text=raw)
        if not text:
            # Nothing, or only reasoning (the codec takes a thinking model's <think> block out).
            return text, "it was empty (only reasoning, or nothing at all)"
        if len(text) > self.cap and not looks_like_error(text) and not self.shortened:
            text = self._shorten(text)
        problem = summary_answer_problem(text=text, cap=self.cap) or summary_problem(
            text=text, previous=self.previous, replaced_runes=self.replaced, material=self.material
        )
        return text.strip(), problem

    def _shorten(self, text: str) -> str:
        """Grown past its cap: the summary compressed once rather than rejected outright."""
        self.shortened = True
        try:
            shorter = summarise_call(
                instructions=SUMMARY_SYSTEM_PROMPT,
                content=(
                    f"{_SHORTEN} {self.cap * 9 // 10} characters. Keep the sections and every "
                    f"exact identifier.\n\n{text}"
                ),
                max_tokens=self.max_tokens,
                counter=self.counter,
            ).text
        except (ContextLengthExceeded, EmptyStream):
            return text
        return summary_prefix_strip(text=shorter) or text
