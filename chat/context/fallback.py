"""The extractive fallback: the session summary written without a model, when the model's own
was rejected (chat/context/merge.py). It must never make the summary worse, round after round:

- sentences are kept for what they carry (identifiers, names, places, dates, first-person
  statements and preferences: chat/context/facts.py), not for where they stand, so "Hey Mel!
  Good to see you!" gives way to "I live in Bratislava.";
- the previous summary's bullets are carried over verbatim under their sections, never
  re-summarised (re-extracting its own output is how the old fallback decayed into noise),
  and when room runs out the lightest go first, the oldest last: an early fact survives;
- a sentence is whole, or cut at a clause or word boundary with "…", never mid-word;
- "Exact identifiers" lists the identifiers of everything summarised that no kept sentence
  already shows, oldest first;
- at most `max_runes`; the empty sections' headings are left out only when the cap is too
  small to afford them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chat.context.facts import (
    clause_cut,
    identifier_key,
    identifier_listable,
    identifiers_find,
    sentence_kind,
    sentence_weight,
    sentences_split,
)
from chat.context.guard import SUMMARY_HEADINGS, summary_heading_of
from chat.context.heading import DIGEST_SEPARATOR, is_summary_prefix
from chat.context.summarise import TranscriptMessage, transcript_text
from chat.workers import background_yield

_FACTS, _TASKS, _PREFERENCES, _QUESTIONS, _IDENTIFIERS = SUMMARY_HEADINGS
_SECTION_OF_KIND = {"fact": _FACTS, "task": _TASKS, "preference": _PREFERENCES}
_ROLE = re.compile(r"^(user|assistant|tool|system|summary):\s*", re.IGNORECASE)
_PLACEHOLDERS = ("(none recorded)", "(none)", "none", "n/a", "无")
# A sentence weighing this much (chat/context/facts.py) is a fact: heavier is not better.
_FACT_WEIGHT = 4
# Carried items' ages run from 0 to this; the transcript's come after.
_AGE_SCALE = 1000
# Below this cap the empty sections' headings (~100 runes together) cost more than they help.
_ALL_HEADINGS_MIN_RUNES = 600


@dataclass(slots=True)
class _Item:
    text: str
    role: str
    section: str
    weight: int
    # Age: carried items first, in their old order, then the transcript's sentences.
    order: int
    # Sentences of one bullet (or one message) are rendered as one bullet again.
    group: int
    new: bool


def _key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".!?。！？… ")


def _says(text: str, key: str) -> bool:
    """Whether `text` holds `key` with no letter or digit either side ("art" is not in
    "smart")."""
    at = text.find(key)
    while at >= 0:
        end = at + len(key)
        if not (at and text[at - 1].isalnum()) and not (end < len(text) and text[end].isalnum()):
            return True
        at = text.find(key, at + 1)
    return False


def _previous_parse(previous: str) -> tuple[list[_Item], list[str]]:
    """The previous summary's items (verbatim, with their sections) and its identifiers."""
    items: list[_Item] = []
    identifiers: list[str] = []
    section = _FACTS
    for group, raw in enumerate(previous.splitlines()):
        line = raw.strip()
        if not line or is_summary_prefix(line=line):
            continue
        heading = summary_heading_of(line)
        if heading is not None:
            section = heading
            continue
        body = line.lstrip("-*•· ").strip()
        if not body or body.lower() in _PLACEHOLDERS:
            continue
        if section == _IDENTIFIERS:
            identifiers.extend(p.strip() for p in body.split("; ") if p.strip())
            continue
        role_match = _ROLE.match(body)
        role = role_match.group(1).lower() if role_match else ""
        rest = body[role_match.end() :] if role_match else body
        for sentence in sentences_split(rest):
            # Kept once already: it stays ahead of an equally heavy new sentence.
            weight = sentence_weight(sentence) + 1
            items.append(_Item(sentence, role, section, weight, len(items), group, new=False))
    # Sections are laid out one after another, so an item's place in the summary says how old
    # it is only within its section: the first preference is as old as the first fact.
    for section_name in SUMMARY_HEADINGS:
        own = [i for i in items if i.section == section_name]
        for index, item in enumerate(own):
            item.order = index * _AGE_SCALE // len(own)
    return items, identifiers


def _transcript_items(
    messages: Sequence[TranscriptMessage], *, first_order: int, first_group: int, item_cap: int
) -> list[_Item]:
    items: list[_Item] = []
    for group, message in enumerate(messages, start=first_group):
        # Each message's sentences are ~1 ms of Python: a send on its way goes first.
        background_yield()
        if message.role == "system":
            continue
        for sentence in sentences_split(transcript_text(message)):
            weight = sentence_weight(sentence)
            if weight <= 0:
                continue
            text = clause_cut(sentence, limit=item_cap)
            if not text:
                continue
            section = _SECTION_OF_KIND[sentence_kind(sentence)]
            order = first_order + len(items)
            items.append(_Item(text, message.role, section, weight, order, group, new=True))
    return items


def _bullets(items: list[_Item]) -> list[str]:
    bullets: list[str] = []
    last_group = None
    for item in items:
        if item.group == last_group and bullets:
            bullets[-1] += f" {item.text}"
        else:
            bullets.append(f"- {item.role}: {item.text}" if item.role else f"- {item.text}")
        last_group = item.group
    return bullets


def _render(items: list[_Item], identifiers: list[str], *, all_headings: bool) -> str:
    blocks = []
    for heading in SUMMARY_HEADINGS:
        if heading == _IDENTIFIERS:
            lines = [f"- {'; '.join(identifiers)}"] if identifiers else []
        else:
            lines = _bullets(sorted((i for i in items if i.section == heading), key=_age))
        if lines or all_headings:
            blocks.append("\n".join([f"## {heading}", *lines]))
    return "\n\n".join(blocks)


def _age(item: _Item) -> int:
    return item.order


def _rank(item: _Item) -> tuple[int, int]:
    # Past a few points a sentence is a fact, whatever else it carries: among facts the older
    # wins, so what was said first is kept through every round (the newest have their own
    # share in `_select`), and the middle, which recall can still find, goes first.
    return (-min(item.weight, _FACT_WEIGHT), item.order)


def _richest(item: _Item) -> tuple[int, int]:
    return (-item.weight, item.order)


def _select(candidates: list[_Item], *, room: int) -> list[_Item]:
    """The heaviest items that fit `room`, a third of it kept for the new transcript's (so a
    summary full of old facts still takes in new ones); ties go to the older."""
    chosen: list[_Item] = []
    taken: set[int] = set()
    used = 0

    def take(pool: list[_Item], limit: int, key: Callable[[_Item], tuple[int, int]]) -> None:
        nonlocal used
        for item in sorted(pool, key=key):
            cost = len(item.text) + len(item.role) + 5
            if id(item) not in taken and used + cost <= limit:
                chosen.append(item)
                taken.add(id(item))
                used += cost

    take([i for i in candidates if i.new], room // 3, _richest)
    take(candidates, room, _rank)
    return chosen


def summary_extractive(
    *,
    previous: str,
    messages: Sequence[TranscriptMessage],
    max_runes: int,
    beside: str = "",
    all_headings: bool | None = None,
) -> str:
    """The fallback summary of `previous` plus `messages`, at most `max_runes` long. `beside`:
    a text shown with it (the model's summary a digest follows, chat/context/digest.py): a
    new sentence or an identifier it already says is left out. `all_headings`: the empty
    sections' headings too (by default when the cap affords them); without them, and with
    nothing to keep, the summary is ""."""
    max_runes = max(0, max_runes)
    if all_headings is None:
        all_headings = max_runes >= _ALL_HEADINGS_MIN_RUNES
    # A summary with its digest is one summary here: the separator is no item.
    previous = previous.replace(DIGEST_SEPARATOR, "\n")
    frame = len(_render([], [], all_headings=all_headings))
    room = max(0, max_runes - frame)
    item_cap = max(40, min(280, room // 3))
    carried, identifiers = _previous_parse(previous)
    fresh = _transcript_items(
        messages,
        first_order=_AGE_SCALE,
        first_group=len(previous.splitlines()) + 1,
        item_cap=item_cap,
    )
    candidates: list[_Item] = []
    seen: set[str] = set()
    said = _key(beside)
    for item in [*carried, *fresh]:
        key = _key(item.text)
        # Only new sentences: one carried already was not said when it was kept, and if the
        # model says it now, its next summary may not.
        if said and item.new and _says(said, key):
            continue
        if key not in seen:
            seen.add(key)
            candidates.append(item)
    for text in [*(i.text for i in carried), *(transcript_text(m) for m in messages)]:
        background_yield()
        identifiers.extend(i for i in identifiers_find(text) if identifier_listable(i))
    chosen = _select(candidates, room=room - min(room // 4, len("; ".join(identifiers))))
    shown_beside = identifier_key(beside)
    while True:
        body = _render(chosen, [], all_headings=all_headings)
        shown = f"{identifier_key(body)}\n{shown_beside}"
        listed: list[str] = []
        keys: set[str] = set()
        for identifier in identifiers:
            key = identifier_key(identifier)
            if key and key not in shown and key not in keys:
                keys.add(key)
                listed.append(identifier)
        # Identifiers first in, first kept: the oldest are the ones no later sentence repeats.
        extra = len("\n\n## " + _IDENTIFIERS) if not all_headings else 0
        while listed and len(body) + extra + len("\n- " + "; ".join(listed)) > max_runes:
            listed.pop()
        text = _render(chosen, listed, all_headings=all_headings)
        if len(text) <= max_runes or not chosen:
            break
        chosen.remove(max(chosen, key=_rank))
    if len(text) > max_runes:
        # A cap smaller than the headings themselves: whole lines only.
        cut = text[:max_runes]
        text = cut.rsplit("\n", 1)[0] if "\n" in cut else ""
    return text
