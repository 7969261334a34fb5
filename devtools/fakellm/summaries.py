"""How the fake server answers summary calls (`configure(summary_style=...)`), standing in for
models of different quality, so a benchmark can measure what each does to the payload:

- "digest" (the default): a deterministic extractive digest of the input (scripts.py).
- "fail": HTTP 500 on every summary call, as a summary model that is down.
- "unusable": an answer no summary guard should take: the request's opening lines echoed back
  (the instructions' scaffold and the transcript's `[#id role]` labels), as small models do.
- "vague": short, well-formed, under the section headings the prompt asks for, and empty of
  facts ("The two friends caught up about their lives and plans.").
- "good": what a capable model writes: the previous summary's items kept, and the sentences of
  the new transcript that carry facts (names, numbers, dates, first-person statements) copied,
  the most informative first when they do not fit, under the asked-for headings, within the
  length the prompt asks for and shorter than what it summarises.

Only the request's text is read (its "## Heading" lines, the "at most N characters" ask and the
scaffold lines of chat.llm.base), never the app's internals, as a real model only reads its
prompt.
"""

from __future__ import annotations

import re

from chat.llm.base import SUMMARY_SCAFFOLD, Message, message_text, requested_max_runes

SUMMARY_STYLES = ("digest", "fail", "unusable", "vague", "good")
VAGUE_TEXT = "The two friends caught up about their lives and plans."
_EXISTING, _EXCERPT, _RETURN, _EXTRA, _SHORTEN = SUMMARY_SCAFFOLD
_HEADING = re.compile(r"^##\s+(.+?)\s*$", re.MULTILINE)
_LABEL = re.compile(r"^\[#\d+ \w+\]\s*", re.MULTILINE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "monday|tuesday|wednesday|thursday|friday|saturday|sunday|yesterday|tomorrow|tonight|"
    "last (?:week|month|year|weekend)|next (?:week|month|year|weekend)|ago"
)
_SIGNALS = (
    re.compile(r"\d"),
    re.compile(rf"\b(?:{_MONTHS})\b", re.IGNORECASE),
    # A capitalised word not at the sentence's start: a name or a place.
    re.compile(r"(?<=[a-z,;] )(?!I\b|I')[A-Z][a-z]+"),
    re.compile(r"\b(?:I|my|I'm|I've|we|our)\b"),
)
_NONE = "- (none)"


def _request_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


def _headings(messages: list[Message]) -> list[str]:
    """The section headings the system prompt asks for, in its order."""
    system = " \n".join(message_text(m) for m in messages if m.get("role") == "system")
    return _HEADING.findall(system)


def _between(text: str, start: str, ends: tuple[str, ...]) -> str:
    if start not in text:
        return ""
    rest = text.split(start, 1)[1]
    cut = min((rest.find(e) for e in ends if e in rest), default=len(rest))
    return rest[:cut].strip()


def _framed(sections: dict[str, list[str]], headings: list[str]) -> str:
    if not headings:
        return "\n".join(f"- {item}" for items in sections.values() for item in items)
    blocks = []
    for heading in headings:
        items = sections.get(heading) or []
        body = "\n".join(f"- {item}" for item in items) if items else _NONE
        blocks.append(f"## {heading}\n{body}")
    return "\n\n".join(blocks)


def _score(sentence: str) -> int:
    return sum(1 for signal in _SIGNALS if signal.search(sentence))


def _previous_items(previous: str) -> list[str]:
    items = []
    for raw in previous.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line in ("(none)", _NONE):
            continue
        item = line.lstrip("-*• ").strip()
        if item and item not in ("(none)", "(none recorded)"):
            items.append(item)
    return items


def _transcript_sentences(transcript: str) -> list[str]:
    out = []
    for block in _LABEL.split(transcript):
        for sentence in _SENTENCE.split(" ".join(block.split())):
            if sentence and _score(sentence) >= 2:
                out.append(sentence)
    return out


def _fit(items: list[str], *, room: int) -> list[str]:
    """The items that fit in `room` runes as bullets: the most informative first (the older
    on a tie), given back in their original order."""
    ranked = sorted(range(len(items)), key=lambda i: (-_score(items[i]), i))
    kept: set[int] = set()
    used = 0
    for i in ranked:
        cost = len(items[i]) + 3
        if used + cost <= room:
            kept.add(i)
            used += cost
    return [items[i] for i in sorted(kept)]


def good_summary(messages: list[Message], *, cap: int) -> str:
    text = _request_text(messages)
    headings = _headings(messages)
    if text.startswith(_SHORTEN):
        previous, transcript = text.split("\n\n", 1)[-1], ""
    else:
        previous = _between(text, _EXISTING, (_EXCERPT,))
        transcript = _between(text, _EXCERPT, (_RETURN, _EXTRA))
    items = list(dict.fromkeys(_previous_items(previous) + _transcript_sentences(transcript)))
    material = len(previous) + len(transcript)
    # Shorter than what it replaces (a summary as long as its input summarises nothing), once
    # there is enough of it for the headings alone not to outweigh it.
    limit = min(cap, material * 7 // 10) if material >= 1500 else cap
    frame = sum(len(h) + len(_NONE) + 6 for h in headings)
    kept = _fit(items, room=max(0, limit - frame))
    first = headings[0] if headings else "summary"
    return _framed({first: kept}, headings)[:limit]


def summary_reply(*, style: str, messages: list[Message], cap: int) -> str:
    """The content of a summary call's answer under `style` ("digest" and "fail" are answered
    by the caller). `cap`: the runes the call allows (max_tokens, the prompt's ask)."""
    asked = requested_max_runes(messages)
    cap = min(cap, asked) if asked else cap
    if style == "unusable":
        return _request_text(messages)[:1200]
    if style == "vague":
        headings = _headings(messages)
        return _framed({headings[0] if headings else "": [VAGUE_TEXT]}, headings)
    if style == "good":
        return good_summary(messages, cap=cap)
    raise ValueError(f"summary_style {style!r} has no scripted answer")
