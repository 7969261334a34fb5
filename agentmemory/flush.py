"""Rescue memory before compaction: every batch that compaction is about to merge
into the rolling summary of an agent's session is first archived to the agent's daily note,
then (optionally) distilled into long-term entries by one LLM call.

The guarantees, and how the ledger (`MemoryFlush`) gives them:

* No batch leaves the verbatim context without a flush record. The pre-compaction hook
  `memory_flush_before_compaction` returns only once the note is written and its ledger row
  says so; if the append fails it raises, and the context engine then aborts that compaction
  (the anchor does not move). Extraction is *after* that point and never raises.
* No batch is written twice. A ledger row is created (`pending`) before the append and marked
  `written` after it; the block carries an HTML-comment marker naming the session and range.
  A later flush of the session first settles pending rows (marker found in the note: written;
  not found: the append never happened, drop the row), then appends only the messages above the
  session's watermark (the highest `to_message_id` written). Compaction takes a session's
  messages in id order under a lease, so a retried compaction (summary failed after the flush,
  CAS conflict...) finds its messages below the watermark and appends nothing, whether it cuts
  the same range or a different one. A truncation rewind moves the anchor back over messages
  that are already archived; they are not archived again either.
* Audit: `memory_flush_audit` checks that every message before the anchor of an agent session
  lies in a written range (or predates the session's agent: see its docstring).
* A failed extraction is logged (`agent_memory_extract_failed`), kept as `failed` with its
  error, and retried on the next flush of the session and by `manage.py
  memory_retry_extractions`, up to MAX_EXTRACT_ATTEMPTS.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from django.db.models import Max

from agentmemory import store
from agentmemory.clock import agent_now
from agentmemory.folders import agent_known
from agentmemory.models import ExtractStatus, MemoryFlush, NoteStatus
from chat.context import for_model
from chat.context.summarise import (
    TranscriptMessage,
    summarise_call,
    transcript_render,
    transcript_text,
)
from chat.llm import LLMError, get_provider
from chat.markdown_text import markdown_code_span, markdown_fenced, markdown_plain
from chat.models import EXCLUDED_FROM_MODEL, Agent, ChatMessage, ChatSession
from chat.services.agents import agent_settings

logger = logging.getLogger("agentmemory.flush")

#: In the extraction call's system prompt, so fakes and logs can tell it from a chat call. It
#: is deliberately not SUMMARY_MARKER: the answer must be a JSON list, not a digest.
MEMORY_EXTRACT_MARKER = "CADAU_MEMORY_EXTRACT"
MAX_EXTRACT_ATTEMPTS = 5
# Retries piggy-backing on a flush are bounded so a compaction never waits on a long backlog.
RETRIES_PER_FLUSH = 2
EXTRACT_INPUT_MAX_RUNES = 24_000
EXTRACT_EXISTING_MAX_RUNES = 3_000
MAX_FACTS_PER_BATCH = 20
# A note keeps the conversation readable, not every byte of a 1 MB tool dump (the database
# still has it); this also keeps a block under the store's append cap.
NOTE_MESSAGE_MAX_RUNES = 8_000
NOTE_BLOCK_MAX_RUNES = 1_000_000
ARCHIVE_HEADING = "Context-compaction archive (上下文压缩归档)"


class FlushMessage(TranscriptMessage, Protocol):
    # A transcript message with its id (daily notes cite it). Read-only, so the context
    # engine's frozen TailMessage fits.
    @property
    def id(self) -> int: ...


class ExtractFailed(Exception):
    pass


def _marker(*, session_id: int, from_id: int, to_id: int) -> str:
    return f"<!-- cadau:flush session={session_id} messages={from_id}-{to_id} -->"


def note_line(message: FlushMessage, *, clip: int) -> str:
    """A message as the daily note shows it, under its label and only there. More than one
    line goes in a fence of its own: as Markdown it could write a label of its own (a turn of
    the assistant's that never happened, which the agent reading its notes would take for
    one), a heading, or a fence that swallows the turns after it. One line stays on the
    label's line, in a code span when it could make raw HTML (the export's rule)."""
    text = transcript_text(message, clip=clip)
    label = f"**{message.role}** (#{message.id}):"
    if "\n" in text:
        return f"{label}\n\n{markdown_fenced(text)}"
    return f"{label} {text if markdown_plain(text) else markdown_code_span(text)}"


def _note_body(messages: Sequence[FlushMessage], *, session_id: int, marker: str) -> str:
    limit = NOTE_MESSAGE_MAX_RUNES
    while True:
        lines = [note_line(m, clip=limit) for m in messages]
        body = "\n\n".join([marker, *lines])
        if len(body) <= NOTE_BLOCK_MAX_RUNES or limit <= 200:
            return body[:NOTE_BLOCK_MAX_RUNES]
        limit //= 2


def _watermark(session_id: int) -> int:
    value = MemoryFlush.objects.filter(
        session_id=session_id, note_status=NoteStatus.WRITTEN
    ).aggregate(top=Max("to_message_id"))["top"]
    return int(value or 0)


def _settle_pending(*, session: ChatSession, agent_id: int) -> None:
    """A row left `pending` means a flush died between creating it and marking the append done.
    The marker in the note says which of the two happened."""
    for row in MemoryFlush.objects.filter(session_id=session.pk, note_status=NoteStatus.PENDING):
        note = store.daily_note_read(agent_id=row.agent_id or agent_id, day=row.note_date)
        marker = _marker(
            session_id=session.pk, from_id=row.from_message_id, to_id=row.to_message_id
        )
        if marker in note:
            row.note_status = NoteStatus.WRITTEN
            row.save(update_fields=["note_status", "updated_at"])
        else:
            row.delete()


def memory_flush_before_compaction(
    *, session: ChatSession, messages: Sequence[FlushMessage]
) -> None:
    """The pre-compaction hook. Raises (aborting the compaction) only when the archive cannot be
    written; see the module docstring."""
    agent = session.agent
    if agent is None or not messages:
        return
    with agent_known(agent):
        _flush(session=session, agent=agent, messages=messages)


def _flush(*, session: ChatSession, agent: Agent, messages: Sequence[FlushMessage]) -> None:
    _settle_pending(session=session, agent_id=agent.pk)
    watermark = _watermark(session.pk)
    remaining = [m for m in messages if m.id > watermark]
    row = None
    if remaining:
        row = _archive(session=session, agent=agent, messages=remaining)
        if agent_settings(agent=agent).memory_auto_extract:
            memory_extract(row=row, messages=remaining)
        else:
            _set_extract(row, ExtractStatus.SKIPPED, error="memory_auto_extract is off")
    else:
        logger.info(
            "agent_memory_flush_skipped session=%s agent=%s range=%s-%s watermark=%s "
            "reason=already_archived",
            session.pk,
            agent.pk,
            messages[0].id,
            messages[-1].id,
            watermark,
        )
    # Earlier failures get another go; a row that failed just now waits for the next flush.
    _retry_some(session=session, limit=RETRIES_PER_FLUSH, exclude=row.pk if row else None)


def _archive(
    *, session: ChatSession, agent: Agent, messages: Sequence[FlushMessage]
) -> MemoryFlush:
    # The agent's day, not UTC's (agentmemory/clock.py).
    now = agent_now(agent=agent)
    from_id, to_id = messages[0].id, messages[-1].id
    title = f" “{session.title}”" if session.title else ""
    heading = (
        f"{ARCHIVE_HEADING} · {now:%H:%M %Z} · session {session.pk}{title} · "
        f"messages #{from_id}–#{to_id}"
    )
    marker = _marker(session_id=session.pk, from_id=from_id, to_id=to_id)
    runes = sum(len(m.content or "") for m in messages)
    row = MemoryFlush.objects.create(
        session=session,
        agent=agent,
        from_message_id=from_id,
        to_message_id=to_id,
        message_count=len(messages),
        runes=runes,
        note_date=now.date(),
        note_heading=heading[:300],
    )
    store.daily_note_append(
        agent_id=agent.pk,
        day=now.date(),
        heading=heading,
        body=_note_body(messages, session_id=session.pk, marker=marker),
    )
    row.note_status = NoteStatus.WRITTEN
    row.save(update_fields=["note_status", "updated_at"])
    logger.info(
        "agent_memory_flush session=%s agent=%s range=%s-%s messages=%d runes=%d note=%s",
        session.pk,
        agent.pk,
        from_id,
        to_id,
        len(messages),
        runes,
        now.date().isoformat(),
    )
    return row


# --- extraction ----------------------------------------------------------------------------

EXTRACT_SYSTEM_PROMPT = f"""{MEMORY_EXTRACT_MARKER}
You curate the long-term memory of an assistant. From the conversation excerpt, list the durable
facts worth keeping across conversations: the user's stable preferences and constraints,
personal details they chose to share, decisions, commitments and deadlines, names of projects,
people, files and other exact identifiers, and corrections of earlier facts. Leave out small
talk, one-off questions and anything only true for the moment. Do not restate facts already in
the existing memory unless they changed; then state the new version.
Answer with a JSON array only, no prose: [{{"fact": "one self-contained sentence", "tags":
["topic"]}}], in the conversation's language. Answer [] when there is nothing durable."""

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


def parse_facts(text: str) -> list[tuple[str, list[str]]]:
    """The facts in an extraction answer. Accepts the array bare, fenced, or inside prose, with
    items as objects ({"fact"|"content"|"text", "tags"?}) or plain strings. Raises
    ExtractFailed when there is no JSON array at all (an error page, a refusal...)."""
    cleaned = _FENCE.sub("", text.strip())
    data: Any = None
    try:
        data = json.loads(cleaned)
    except ValueError:
        start, end = cleaned.find("["), cleaned.rfind("]")
        if start != -1 and end > start:
            try:
                data = json.loads(cleaned[start : end + 1])
            except ValueError:
                data = None
    if isinstance(data, dict):
        data = data.get("facts", data.get("memories"))
    if not isinstance(data, list):
        raise ExtractFailed(f"the answer is not a JSON list: {text[:120]!r}")
    facts: list[tuple[str, list[str]]] = []
    for item in data:
        fact: Any = item
        tags: Any = []
        if isinstance(item, dict):
            fact = item.get("fact") or item.get("content") or item.get("text")
            tags = item.get("tags") or []
        if not isinstance(fact, str) or not fact.strip():
            continue
        if not isinstance(tags, list):
            tags = []
        facts.append((fact.strip(), [t for t in tags if isinstance(t, str)]))
    return facts[:MAX_FACTS_PER_BATCH]


def _transcript(messages: Iterable[FlushMessage]) -> str:
    text = transcript_render(messages, clip=4000)
    return text[-EXTRACT_INPUT_MAX_RUNES:]


def _set_extract(row: MemoryFlush, status: str, *, error: str = "", entries: int = 0) -> None:
    row.extract_status = status
    row.error = error[:2000]
    row.entries_written = entries
    row.save(update_fields=["extract_status", "error", "entries_written", "attempts", "updated_at"])


def memory_extract(*, row: MemoryFlush, messages: Sequence[FlushMessage]) -> bool:
    """One LLM call distilling `messages` into entries (entry_write dedups: same or near-same
    facts update the existing entry). Never raises; True when it succeeded."""
    agent_id = row.agent_id
    if agent_id is None:
        _set_extract(row, ExtractStatus.SKIPPED, error="the agent was deleted")
        return False
    if get_provider().is_offline:
        # The offline provider has no model to distil with; the note already holds everything.
        _set_extract(row, ExtractStatus.SKIPPED, error="offline provider")
        return False
    transcript = _transcript(messages)
    existing = store.entries_for_prompt(
        agent_id=agent_id, query=transcript, max_runes=EXTRACT_EXISTING_MAX_RUNES
    )
    row.attempts += 1
    started = time.monotonic()
    try:
        result = summarise_call(
            instructions=EXTRACT_SYSTEM_PROMPT,
            content=(
                f"Existing memory:\n{existing or '(none)'}\n\nConversation excerpt:\n{transcript}"
            ),
            max_tokens=2000,
            temperature=0.0,
        )
        facts = parse_facts(result.text)
        written = 0
        for fact, tags in facts:
            try:
                store.entry_write(
                    agent_id=agent_id,
                    name=None,
                    content=fact,
                    source_session_id=row.session_id,
                    source_message_id=row.from_message_id,
                    tags=[*tags, "extracted"],
                )
                written += 1
            except ValueError:  # empty, too long or an unusable tag: skip that one fact
                continue
    except (LLMError, ExtractFailed, OSError) as exc:
        logger.warning(
            "agent_memory_extract_failed session=%s agent=%s range=%s-%s attempt=%d error=%s",
            row.session_id,
            agent_id,
            row.from_message_id,
            row.to_message_id,
            row.attempts,
            f"{type(exc).__name__}: {exc}",
        )
        _set_extract(row, ExtractStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        return False
    _set_extract(row, ExtractStatus.DONE, entries=written)
    logger.info(
        "agent_memory_extract session=%s agent=%s range=%s-%s facts=%d duration_ms=%d",
        row.session_id,
        agent_id,
        row.from_message_id,
        row.to_message_id,
        written,
        int((time.monotonic() - started) * 1000),
    )
    return True


def memory_extract_retry(*, row: MemoryFlush) -> bool:
    """Retry one failed/pending extraction from the stored messages (compaction never deletes
    them; a truncation may have, and then there is nothing left to distil)."""
    rows = ChatMessage.objects.filter(
        session_id=row.session_id, id__gte=row.from_message_id, id__lte=row.to_message_id
    ).order_by("id")
    messages = list(for_model(rows))
    if not messages:
        _set_extract(row, ExtractStatus.SKIPPED, error="the messages no longer exist")
        return False
    return memory_extract(row=row, messages=messages)


def _retry_candidates() -> Any:
    return MemoryFlush.objects.filter(
        extract_status__in=(ExtractStatus.FAILED, ExtractStatus.PENDING),
        note_status=NoteStatus.WRITTEN,
        attempts__lt=MAX_EXTRACT_ATTEMPTS,
    ).order_by("id")


def _retry_some(*, session: ChatSession, limit: int, exclude: int | None) -> None:
    # Only rows that already failed at least once: a `pending` one with 0 attempts belongs to a
    # flush still running its first extraction.
    rows = _retry_candidates().filter(session_id=session.pk, attempts__gt=0)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    for row in rows[:limit]:
        memory_extract_retry(row=row)


def memory_retry_extractions(*, limit: int = 100) -> tuple[int, int]:
    """Retry failed extractions everywhere. Returns (tried, succeeded)."""
    tried = succeeded = 0
    for row in _retry_candidates().filter(attempts__gt=0)[:limit]:
        tried += 1
        succeeded += memory_extract_retry(row=row)
    return tried, succeeded


def memory_flush_audit(*, session: ChatSession) -> list[tuple[int, int]]:
    """Message id ranges of `session` that were compacted into the summary (id < anchor) but are in
    no written flush range: [] when the rule held. Only meaningful for sessions that had their
    agent from the start (messages summarised before an agent was attached were never due)."""
    anchor = session.verbatim_since_message_id
    if anchor is None:
        return []
    ranges = sorted(
        MemoryFlush.objects.filter(
            session_id=session.pk, note_status=NoteStatus.WRITTEN
        ).values_list("from_message_id", "to_message_id")
    )
    ids = ChatMessage.objects.filter(session_id=session.pk, id__lt=anchor).exclude(
        status__in=EXCLUDED_FROM_MODEL
    )
    gaps: list[tuple[int, int]] = []
    for message_id in ids.order_by("id").values_list("id", flat=True).iterator():
        if not any(lo <= message_id <= hi for lo, hi in ranges):
            if gaps and gaps[-1][1] == message_id - 1:
                gaps[-1] = (gaps[-1][0], message_id)
            else:
                gaps.append((message_id, message_id))
    return gaps
