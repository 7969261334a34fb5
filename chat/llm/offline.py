"""The provider a fresh install runs with: no network, no model, still usable.

Chat replies say plainly that no model is configured and how to configure one. Summaries are
extractive (see `extractive_summary`): deterministic, built only from the text given, so the
rolling context keeps working offline and tests get predictable output.

Which `complete()` calls are summaries: those whose first system message carries
`SUMMARY_MARKER`, and, because a summary stored as "no model configured" would poison the
rolling context, also those whose system prompt plainly asks to summarise / compress /
checkpoint (English or Chinese).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

from chat.llm.base import (
    SUMMARY_SCAFFOLD,
    Completion,
    Message,
    StreamEvent,
    is_summary_request,
    message_text,
    requested_max_runes,
)

#: The offline summariser has no tokenizer; it counts 1 token as 4 runes (code points), the
#: usual rough figure for English. `max_tokens=N` therefore caps a summary at 4*N runes.
RUNES_PER_TOKEN = 4

#: Used when the caller gives neither `max_runes` nor `max_tokens`.
DEFAULT_SUMMARY_MAX_RUNES = 6000

_SUMMARY_HINTS = ("summar", "compress", "condense", "digest", "checkpoint", "摘要", "压缩", "总结")

# A sentence ends at . ! ? (followed by whitespace) or at a CJK terminator.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])")
_URL = re.compile(r"https?://[^\s<>\"'）)]+")
_PATH = re.compile(
    r"(?:~|\.{1,2})?(?:/[\w.@+-]+){2,}/?|\b[\w-]+(?:/[\w.-]+)+\.\w+\b|\b[\w-]+\.(?:py|js|ts|md|json|yaml|yml|toml|txt|csv|sql|html|css|go|rs|sh)\b"
)
# Numbers with a glued unit ("42s", "10GB", "3.5%") or a CJK counter ("3000 元").
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?\d[\d,.:/%-]*(?:[a-zA-Z%]{1,3}\b|\s?[万亿元个条次天年月日号])?"
)
_CODE = re.compile(r"`[^`\n]{1,80}`")
# Ticket, account and host names: a word joined to digits by - or _ ("ACC-99812", "db-7",
# "api_v2"), taken whole before the number inside it is.
_IDENT = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*[-_][A-Za-z]*\d[\w-]*")
# Likely names: runs of capitalised words ("Alice Smith"), a capitalised word mid-sentence,
# CamelCase and ACRONYMS ("PostgreSQL", "API").
_NAME = re.compile(
    r"\b[A-Z][a-z]+(?:\s+[A-Z][\w-]+)+"
    r"|(?<=[a-z0-9,;:)] )[A-Z][\w-]+"
    r"|\b[A-Za-z]*[a-z][A-Z]\w*\b"
    r"|\b[A-Z]{2,}\w*\b"
)

# A transcript line as summarising requests render it: `[#12 user] text`.
_TRANSCRIPT_LABEL = re.compile(
    r"^\[(?:#\d+ )?((?:user|assistant|system|tool)(?: result for [\w.:-]+)?)\] ?(.*)$"
)

# The sections a summarising prompt asks for, as Markdown headings on their own lines
# (chat/context/merge.py's SUMMARY_SYSTEM_PROMPT lists five).
_REQUESTED_HEADING = re.compile(r"^#{2,3} (\S.*?)\s*$", re.MULTILINE)
_PLACEHOLDER_LINES = ("- (none recorded)", "(none recorded)")

_ROLE_LABELS = {"user": "user", "assistant": "assistant", "tool": "tool", "system": "system"}


def _first_sentence(line: str) -> str:
    parts = _SENTENCE_END.split(line, maxsplit=1)
    return parts[0].strip()


def facts_find(text: str) -> list[str]:
    """Things a summary must not lose: URLs, paths, numbers, code spans, names (in order)."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for pattern in (_URL, _CODE, _PATH, _IDENT, _NUMBER, _NAME):
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(s < end and start < e for s, e in taken):
                continue  # a number inside a URL is already kept by the URL
            value = match.group().strip().rstrip(".,;:")
            if value:
                taken.append((start, end))
                found.append((start, value))
    found.sort()
    unique: list[str] = []
    for _, value in found:
        if value not in unique:
            unique.append(value)
    return unique


def _item(line: str, *, sentence_cap: int) -> str:
    """One summary item: the line's first sentence, plus the facts the rest of it carries."""
    head = _first_sentence(line)
    if len(head) > sentence_cap:
        head = head[: sentence_cap - 1].rstrip() + "…"
    # Facts are taken from the whole line, so shortening the sentence never drops a URL/path.
    extra = [f for f in facts_find(line) if f not in head]
    if extra:
        head = f"{head} [{'; '.join(extra)}]"
    return head


def _requested_headings(messages: list[Message]) -> list[str]:
    for message in messages:
        if message.get("role") == "system":
            return _REQUESTED_HEADING.findall(message_text(message))
    return []


def _lines(messages: list[Message], *, headings: list[str]) -> list[str]:
    lines: list[str] = []
    # The previous summary's own headings and empty-section markers are not conversation.
    seen: set[str] = {f"## {h}" for h in headings} | set(_PLACEHOLDER_LINES) if headings else set()
    for message in messages:
        role = str(message.get("role") or "")
        if role == "system":
            continue  # instructions, not conversation
        label = _ROLE_LABELS.get(role, role)
        text = message_text(message)
        for call in message.get("tool_calls") or []:
            function = (call.get("function") or {}) if isinstance(call, dict) else {}
            name = function.get("name", "")
            args = str(function.get("arguments", ""))
            text += f"\ncalled {name}({args})"
        first = True
        for raw in text.splitlines():
            line = " ".join(raw.split())
            if headings:
                line = line.lstrip("-*• ")  # a previous summary's bullet is re-bulleted
            if not line or line in seen or line == "(none)" or line.startswith(SUMMARY_SCAFFOLD):
                continue  # a summarising request's own wording is not the conversation's
            seen.add(line)
            labelled = _TRANSCRIPT_LABEL.match(line)
            if labelled:
                # A rendered transcript line: who said it, without the message id.
                lines.append(f"{labelled.group(1)}: {labelled.group(2)}")
                first = False
                continue
            # Transcripts pasted into one message already carry "user:" labels; label only
            # the first line of a bare message so the reader knows who said it.
            lines.append(f"{label}: {line}" if first and label and ":" not in line[:12] else line)
            first = False
    return lines


def extractive_summary(messages: list[Message], *, max_runes: int) -> str:
    """A deterministic, extractive digest of the non-system messages, at most `max_runes` long.

    One bullet per distinct line: its first sentence plus the URLs, paths, numbers, names and
    code spans found in the rest. When that is too long, sentences are shortened, then items are
    sampled evenly (so both the oldest and the newest material survive), then the text is cut.
    """
    max_runes = max(0, max_runes)
    headings = _requested_headings(messages)
    lines = _lines(messages, headings=headings)
    if not lines or max_runes == 0:
        return ""
    if headings:
        # Everything under the first heading, the others kept (empty) so the answer has the
        # sections the prompt asked for; the headings come first when the cap is that small.
        rest = "".join(f"\n\n## {h}" for h in headings[1:])
        head = f"## {headings[0]}\n"
        digest = _digest(lines, max_runes=max_runes - len(head) - len(rest))
        return f"{head}{digest}{rest}"[:max_runes]
    return _digest(lines, max_runes=max_runes)


def _digest(lines: list[str], *, max_runes: int) -> str:
    if max_runes <= 0:
        return ""
    for sentence_cap in (240, 120, 60, 30):
        items = [_item(line, sentence_cap=sentence_cap) for line in lines]
        text = "\n".join(f"- {item}" for item in items)
        if len(text) <= max_runes:
            return text
    # Still too long: keep an even sample of items, always the first and the last.
    count = len(items)
    keep = count
    while keep > 1:
        keep -= 1
        step = (count - 1) / (keep - 1) if keep > 1 else 0
        picked = sorted({round(i * step) for i in range(keep)} | {count - 1})
        text = "\n".join(f"- {items[i]}" for i in picked)
        if len(text) <= max_runes:
            return text
    return text[: max_runes - 1] + "…" if max_runes > 1 else text[:max_runes]


def _summary_cap(*, max_runes: int | None, max_tokens: int | None) -> int:
    if max_runes is not None:
        return max_runes
    if max_tokens is not None:
        return max_tokens * RUNES_PER_TOKEN
    try:
        from django.conf import settings

        return int(settings.CHAT_CONTEXT.summary_max_runes)
    except Exception:  # settings not configured (scripts, the fake server's CLI)
        return DEFAULT_SUMMARY_MAX_RUNES


def _wants_summary(messages: list[Message]) -> bool:
    if is_summary_request(messages):
        return True
    system = " ".join(message_text(m) for m in messages if m.get("role") == "system").lower()
    return any(hint in system for hint in _SUMMARY_HINTS)


def _last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return " ".join(message_text(message).split())
    return ""


def offline_reply(messages: list[Message]) -> str:
    said = _last_user_text(messages)
    if len(said) > 80:
        said = said[:79].rstrip() + "…"
    ack = f"I received your message: “{said}”. " if said else ""
    return (
        "Cadau is running offline: no language model is configured, so I cannot answer yet. "
        f"{ack}"
        "To connect a model, set LLM_BASE_URL to an OpenAI-compatible endpoint (for example "
        "https://api.openai.com/v1, or http://127.0.0.1:11434/v1 for Ollama), LLM_API_KEY to "
        "its key (if it needs one) and LLM_MODEL to the model name, then restart the server. "
        "Your messages are saved either way."
    )


def _words(text: str) -> list[str]:
    # Keep the whitespace with each word so the deltas join back to the exact text.
    return re.findall(r"\S+\s*", text)


class OfflineProvider:
    """LLMProvider that needs no network. See the module docstring."""

    name = "offline"

    def __init__(self, *, model: str = "offline", word_delay_seconds: float = 0.0) -> None:
        self.model = model
        self.summary_model = model
        # A small delay makes the offline reply visibly stream in the UI; tests use 0.
        self.word_delay_seconds = word_delay_seconds

    @property
    def is_offline(self) -> bool:
        return True

    def complete(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        max_runes: int | None = None,
    ) -> Completion:
        """Summaries: extractive, capped by `max_runes`, else `max_tokens` * RUNES_PER_TOKEN,
        else CHAT_CONTEXT_SUMMARY_MAX_RUNES; and never longer than the prompt's own "at most N
        characters" (see base.requested_max_runes). Anything else: the offline notice."""
        if _wants_summary(messages):
            cap = _summary_cap(max_runes=max_runes, max_tokens=max_tokens)
            asked = requested_max_runes(messages)
            cap = min(cap, asked) if asked else cap
            text = extractive_summary(messages, max_runes=cap)
        else:
            text = offline_reply(messages)
        return Completion(text=text, finish_reason="stop", model=self.model)

    async def astream_chat(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        text = offline_reply(messages)
        for word in _words(text):
            # Even with no delay, yield to the loop so a long reply never starves other tasks.
            await asyncio.sleep(self.word_delay_seconds)
            yield StreamEvent(kind="delta", text=word)
        yield StreamEvent(kind="done", text=text, finish_reason="stop")
