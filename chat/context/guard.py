"""The summary guard: what a real model's answer must not be before it replaces history.

Small and local models fail in recognisable ways when asked to summarise (measured against
SmolLM2 on llama.cpp, docs/real-llm-notes.md): they echo the instructions ("Return the merged
summary in at most 6000 characters."), copy the transcript back with its `[#12 user]` labels,
answer with something no shorter than what it replaces, drop the section headings the previous
summary had, or think out loud. Each of those, committed, would make the model's only memory of
older turns worse than the turns themselves.

`summary_problem` names the first failure it finds (or None). The caller retries once with the
failure spelled out (`summary_retry_note`), then falls back to `summary_extractive`: built
without a model from the previous summary and the transcript, keeping every identifier, under
the same headings. A fallback is worse prose but never loses a fact, and it lets compaction
move on, where rejecting again and again would leave the session over its budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from chat.context.heading import is_summary_prefix
from chat.context.summarise import TranscriptMessage, transcript_text
from chat.llm.base import SUMMARY_MARKER, SUMMARY_SCAFFOLD, Message
from chat.llm.offline import extractive_summary, facts_find

#: The session summary's sections (SUMMARY_SYSTEM_PROMPT asks for them, in this order).
SUMMARY_HEADINGS = (
    "Facts and decisions",
    "Open tasks",
    "User constraints and preferences",
    "Pending questions",
    "Exact identifiers",
)

#: The model that wrote a fallback summary, as snapshots and logs show it.
FALLBACK_MODEL = "extractive-fallback"

# Material smaller than this may legitimately come back longer (five headings alone are
# ~100 characters): the length check applies above it.
_LENGTH_CHECK_MIN_RUNES = 1500
_TRANSCRIPT_LABEL = re.compile(r"^\W{0,3}\[#\d+ (?:user|assistant|system|tool)\b", re.MULTILINE)
_HEADING = re.compile(r"^\s{0,3}(?:#{1,6}\s*|\*\*)(.+?)(?:\*\*)?\s*:?\s*$", re.MULTILINE)


def summary_headings(text: str) -> set[str]:
    """Which of SUMMARY_HEADINGS appear as headings (Markdown `##` or bold lines) in `text`."""
    found = {m.group(1).strip().strip("*").strip().lower() for m in _HEADING.finditer(text)}
    return {h for h in SUMMARY_HEADINGS if h.lower() in found}


def summary_problem(*, text: str, previous: str, replaced_runes: int) -> str | None:
    """Why `text` must not become the summary, or None when it may. `replaced_runes`: the
    previous summary plus the transcript it absorbs."""
    lowered = text.lower()
    if "<think>" in lowered or "</think>" in lowered:
        return "reasoning output (a <think> block) instead of a summary"
    if SUMMARY_MARKER.lower() in lowered or any(p.lower() in lowered for p in SUMMARY_SCAFFOLD):
        return "it repeats the instructions"
    if len(_TRANSCRIPT_LABEL.findall(text)) >= 2:
        return "it copies the transcript (its [#id role] lines) instead of summarising it"
    if replaced_runes >= _LENGTH_CHECK_MIN_RUNES and len(text) >= replaced_runes:
        return f"it is no shorter ({len(text)} characters) than what it replaces ({replaced_runes})"
    kept = summary_headings(previous)
    missing = [h for h in SUMMARY_HEADINGS if h in kept and h not in summary_headings(text)]
    if missing:
        return f"it drops the section headings {', '.join(missing)}"
    return None


def summary_retry_note(problem: str) -> str:
    """What the second attempt is told, appended to its request."""
    return (
        f"Your previous answer was rejected because {problem}. Write a new summary: only the "
        "summary, under the five headings, in your own words, shorter than the transcript. "
        "Do not repeat these instructions, do not copy transcript lines, do not think aloud."
    )


def _previous_lines(previous: str) -> str:
    """The previous summary's items without its headings and bullets: the fallback re-files
    them under its own headings."""
    kept = []
    for raw in previous.splitlines():
        line = raw.strip()
        if (
            not line
            or (_HEADING.fullmatch(line) and summary_headings(line))
            # A previous summary stored with the heading it is sent under (written by an older
            # version, or pasted by hand): the heading is not an item, in either language.
            or is_summary_prefix(line=line)
        ):
            continue
        item = line.lstrip("-*• ").strip()
        if item != "(none recorded)":
            kept.append(item)
    return "\n".join(line for line in kept if line)


def summary_extractive(
    *, previous: str, messages: Sequence[TranscriptMessage], max_runes: int
) -> str:
    """A summary written without a model: the previous summary's items and the transcript's
    first sentences under "Facts and decisions", every identifier found under "Exact
    identifiers", the other sections kept (empty) so the next model summary is asked to keep
    them too. At most `max_runes` long."""
    material: list[Message] = []
    previous_items = _previous_lines(previous)
    if previous_items:
        material.append({"role": "summary", "content": previous_items})
    material.extend({"role": m.role, "content": transcript_text(m)} for m in messages)
    identifiers: list[str] = []
    for item in material:
        for fact in facts_find(str(item["content"])):
            if fact not in identifiers:
                identifiers.append(fact)
    empty = "".join(f"\n\n## {h}\n- (none recorded)" for h in SUMMARY_HEADINGS[1:-1])
    frame = len("## Facts and decisions\n") + len(empty) + len("\n\n## Exact identifiers\n")
    room = max(0, max_runes - frame)
    ids_text = "\n".join(f"- {fact}" for fact in identifiers)
    if len(ids_text) > room // 3:
        # Identifiers first in, first kept: the oldest are the ones no later summary repeats.
        ids_text = ids_text[: room // 3].rsplit("\n", 1)[0]
    facts_text = extractive_summary(material, max_runes=room - len(ids_text))
    text = (
        f"## Facts and decisions\n{facts_text or '- (none recorded)'}{empty}"
        f"\n\n## Exact identifiers\n{ids_text or '- (none recorded)'}"
    )
    return text[:max_runes]
