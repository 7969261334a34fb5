"""The summary guard: what a real model's answer must not be before it replaces history.

Small and local models fail in recognisable ways when asked to summarise (measured against
SmolLM2 on llama.cpp, docs/real-llm-notes.md): they echo the instructions ("Existing summary:",
"Return the merged summary in at most 6000 characters."), copy a transcript line back with its
`[#39 user]` label, answer with something no shorter than what it replaces, leave out the
section headings, think out loud, loop ("2029.32.27, 2029.33.28, ..."), invent numbers, codes
and dates that nothing they were given contains, or drop the identifiers the previous summary
kept. Each of those, committed, would make the model's only memory of older turns worse than
the turns themselves.

`summary_problem` names the first failure it finds (or None). The caller retries once with the
failure spelled out (`summary_retry_note`), then commits the extractive fallback
(chat/context/fallback.py): worse prose, but it never loses a fact, and it lets compaction
move on where rejecting again and again would leave the session over its budget.
"""

from __future__ import annotations

import re
from collections import Counter

from chat.context.facts import identifier_key, identifiers_find
from chat.llm.base import SUMMARY_MARKER, SUMMARY_SCAFFOLD

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

# Material this small may legitimately come back as long (a paraphrase of one short turn).
_LENGTH_CHECK_MIN_RUNES = 200
_TRANSCRIPT_LABEL = re.compile(r"\[#\d+ (?:user|assistant|system|tool)\b")
_HEADING = re.compile(r"^\s{0,3}(?:#{1,6}\s*|\*\*)(.+?)(?:\*\*)?\s*:?\s*$", re.MULTILINE)
_BULLET = re.compile(r"^\s*(?:[-*•·]|\d{1,3}[.)])\s*")
_ROLE_LABEL = re.compile(r"^(?:user|assistant|tool|system):\s*", re.IGNORECASE)


# The request's own lines, however a model re-spells them ("Existing summary:", "**New
# transcript excerpt**"). A short phrase counts only as a label (at a line's start, or before a
# colon): a summary may well mention "the existing summary" in passing.
def _echo_pattern(line: str) -> str:
    words = line.split("(")[0].rstrip(": ").split()
    phrase = r"\s*".join(re.escape(w) for w in words)
    if len(words) >= 4:
        return phrase
    return rf"^\W*{phrase}\b|{phrase}\s*(?:\([^)]*\))?\s*[:：]"


_SCAFFOLD_ECHO = re.compile(
    "|".join(_echo_pattern(line) for line in SUMMARY_SCAFFOLD), re.IGNORECASE | re.MULTILINE
)
_PLACEHOLDER = re.compile(r"^\(?(?:none recorded|none|n/a|无)\)?\.?$", re.IGNORECASE)
# Of the previous summary's identifiers, this share may go (rounded down): a summary at its
# cap must make room; a small one must keep them all.
_IDENTIFIERS_MAY_DROP = 10
# A loop: one three-word pattern filling a third of a long answer.
_LOOP_MIN_WORDS = 24


def summary_heading_of(line: str) -> str | None:
    """The SUMMARY_HEADINGS entry `line` is a heading for (Markdown `##` or bold), or None."""
    match = _HEADING.fullmatch(line.strip())
    if match is None:
        return None
    name = match.group(1).strip().strip("*").strip().rstrip(":").strip().lower()
    return next((h for h in SUMMARY_HEADINGS if h.lower() == name), None)


def summary_headings(text: str) -> set[str]:
    """Which of SUMMARY_HEADINGS appear as headings (Markdown `##` or bold lines) in `text`."""
    found = (summary_heading_of(m.group()) for m in _HEADING.finditer(text))
    return {h for h in found if h is not None}


def _body_lines(text: str) -> list[str]:
    """The summary's items: no headings, placeholders, bullets or speaker labels."""
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or summary_heading_of(raw) is not None:
            continue
        line = _ROLE_LABEL.sub("", _BULLET.sub("", raw.strip())).strip()
        if line and not _PLACEHOLDER.match(line):
            lines.append(line)
    return lines


def _triples(text: str) -> Counter[tuple[str, ...]]:
    # Exact words: "question 12 answered, question 13 answered" lists, it does not loop. A
    # loop of made-up numbers ("2029.32.27, 2029.33.28, ...") is caught as invented instead.
    words = re.findall(r"\w+", text.lower())
    return Counter(zip(words, words[1:], words[2:], strict=False))


def _repeats(lines: list[str], *, given: str) -> str | None:
    counts = Counter(" ".join(line.lower().split()) for line in lines if len(line) >= 8)
    line, count = counts.most_common(1)[0] if counts else ("", 0)
    if count >= 2:
        return f"it repeats the line {line[:60]!r} ({count} times)"
    triples = _triples(" ".join(lines))
    words = sum(triples.values()) + 2
    if words >= _LOOP_MIN_WORDS:
        triple, count = triples.most_common(1)[0]
        # A pattern the conversation itself repeats as often ("question 12", "question 13")
        # is the conversation's, not a loop.
        if count >= 4 and count * 3 * 3 >= words and _triples(given)[triple] < count:
            return f"it loops (the pattern {' '.join(triple)!r} {count} times)"
    return None


def _invented(*, text: str, previous: str, material: str) -> str | None:
    given = identifier_key(f"{previous}\n{material}")
    made_up = [i for i in identifiers_find(text) if identifier_key(i) not in given]
    if made_up:
        return (
            f"it names {', '.join(made_up[:5])}, found nowhere in the summary or the "
            "transcript it was given"
        )
    return None


def _dropped(*, text: str, previous: str) -> str | None:
    kept = identifier_key(text)
    expected = identifiers_find(previous)
    lost = [i for i in expected if identifier_key(i) not in kept]
    if len(lost) > len(expected) // _IDENTIFIERS_MAY_DROP:
        return f"it drops identifiers the previous summary kept: {', '.join(lost[:5])}"
    return None


def summary_problem(
    *, text: str, previous: str, replaced_runes: int, material: str = ""
) -> str | None:
    """Why `text` must not become the summary, or None when it may. `replaced_runes`: the
    previous summary plus the transcript it absorbs; `material`: that transcript as the model
    was given it (identifiers found in neither it nor `previous` were invented; without it
    that check is skipped)."""
    lowered = text.lower()
    if "<think>" in lowered or "</think>" in lowered:
        return "reasoning output (a <think> block) instead of a summary"
    if SUMMARY_MARKER.lower() in lowered or _SCAFFOLD_ECHO.search(text):
        return "it repeats the instructions"
    if _TRANSCRIPT_LABEL.search(text):
        return "it copies the transcript (its [#id role] lines) instead of summarising it"
    missing = [h for h in SUMMARY_HEADINGS if h not in summary_headings(text)]
    if missing:
        return f"it leaves out the section headings {', '.join(missing)}"
    lines = _body_lines(text)
    body = sum(len(line) for line in lines)
    if replaced_runes >= _LENGTH_CHECK_MIN_RUNES and body >= replaced_runes:
        return f"it is no shorter ({body} characters) than what it replaces ({replaced_runes})"
    return (
        _repeats(lines, given=f"{previous}\n{material}")
        or (_invented(text=text, previous=previous, material=material) if material else None)
        or _dropped(text=text, previous=previous)
    )


def summary_retry_note(problem: str) -> str:
    """What the second attempt is told, appended to its request."""
    return (
        f"Your previous answer was rejected because {problem}. Write a new summary: only the "
        "summary, under the five headings, in your own words, shorter than the transcript. "
        "Do not repeat these instructions, do not copy transcript lines, do not think aloud."
    )
