"""The rolling model context: one code path for every compaction trigger.

Layers (SPEC §3): the database keeps every message; the model gets `context_summary` (everything
before the verbatim anchor, compressed) + the verbatim tail (id >= anchor) + the new message,
under a rune budget. Compaction moves the anchor forward and merges what it passes into the
summary. It never deletes or edits a message.

What this does better than the seed's loop (which `strategy="seed"` still runs, for comparison):
- reads only the verbatim tail, newest first and bounded, never the summarised history;
- picks the cut without calling the model, down to a lower target watermark (hysteresis), and
  merges the whole cut with one summarising call (more only past the summariser's input cap);
- cuts only at turn boundaries, so a user/assistant turn and an assistant tool call with its
  results always stay together;
- a lease keeps concurrent sends from paying for the same summary, and compare-and-swap on
  `context_version` keeps them from committing over each other;
- a failed or unusable summary changes nothing: the anchor stays, this payload is trimmed for
  this call only, and the next send retries.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from cadau.contextconfig import ContextConfig
from chat.api.errors import ApiError
from chat.llm import get_provider
from chat.llm.base import SUMMARY_MARKER, LLMError, Message
from chat.models import (
    ChatMessage,
    ChatSession,
    ContextSnapshot,
    MessageRole,
    MessageStatus,
    SnapshotOutcome,
)
from chat.selectors import message_exists, message_rows
from chat.services.hooks import pre_roll_hooks, system_prompt_hooks

logger = logging.getLogger("chat.context")

SUMMARY_PREFIX_ZH = "【历史对话摘要（较早轮次已压缩；下文为多轮原文）】"
SUMMARY_PREFIX_EN = (
    "Summary of the earlier conversation (older turns compressed; the verbatim turns follow)"
)
DEFAULT_SYSTEM_PROMPT = "You are Cadau, a helpful assistant. Answer clearly and accurately."
# A summarising call is refused by the lease for this long at most if its holder dies.
LEASE_SECONDS = 300
# Rows fetched per round trip while reading the verbatim tail newest-first.
TAIL_PAGE = 200
_TAIL_FIELDS = ("id", "role", "content", "tool_calls", "tool_call_id", "status")
# Messages that never go to the model: an in-flight reply, or one that failed before finishing.
_EXCLUDED_STATUSES = (MessageStatus.STREAMING, MessageStatus.FAILED)

Trigger = Literal["before_send", "after_reply", "context_error", "manual", "admin"]
Outcome = Literal["committed", "failed", "rejected", "conflict", "skipped", "busy"]


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TailMessage:
    id: int
    role: str
    content: str
    tool_calls: Any
    tool_call_id: str
    runes: int

    @classmethod
    def from_row(cls, row: ChatMessage) -> TailMessage:
        return cls(
            id=row.pk,
            role=row.role,
            content=row.content,
            tool_calls=row.tool_calls,
            tool_call_id=row.tool_call_id,
            runes=message_runes(content=row.content, tool_calls=row.tool_calls),
        )

    def as_openai(self) -> Message:
        msg: Message = {"role": self.role, "content": self.content}
        if self.role == MessageRole.ASSISTANT and self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.role == MessageRole.TOOL:
            msg["tool_call_id"] = self.tool_call_id
        return msg


@dataclass(slots=True)
class ContextState:
    """What the next model call would see, read in a bounded number of rows."""

    session: ChatSession
    cfg: ContextConfig
    system_prompt: str
    tail: list[TailMessage]
    # True when the tail read stopped (row or rune bound) before reaching the anchor: there are
    # unsummarised messages older than `tail` that the payload cannot hold.
    backlog: bool
    rows_read: int

    @property
    def summary(self) -> str:
        return self.session.context_summary

    @property
    def system_runes(self) -> int:
        return len(system_text(system_prompt=self.system_prompt, summary=self.summary))

    @property
    def tail_runes(self) -> int:
        return sum(m.runes for m in self.tail)

    @property
    def runes(self) -> int:
        return self.system_runes + self.tail_runes


@dataclass(slots=True)
class RollResult:
    outcome: Outcome
    trigger: str
    llm_calls: int = 0
    messages_rolled: int = 0
    runes_before: int = 0
    runes_after: int = 0
    rows_read: int = 0
    duration_ms: int = 0
    error: str = ""

    @property
    def changed(self) -> bool:
        return self.messages_rolled > 0


@dataclass(slots=True)
class Payload:
    messages: list[Message]
    runes: int
    limit_runes: int
    # Verbatim messages left out of this one call because the summary could not absorb them.
    dropped: int
    rows_read: int
    rolls: list[RollResult] = field(default_factory=list)


class PayloadTooLarge(Exception):
    """Even the newest turn alone does not fit under the hard limit."""


class SummaryRejected(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Estimation
# --------------------------------------------------------------------------------------------


def message_runes(*, content: str, tool_calls: Any = None) -> int:
    runes = len(content)
    if tool_calls:
        runes += len(json.dumps(tool_calls, ensure_ascii=False))
    return runes


def summary_prefix() -> str:
    return (
        SUMMARY_PREFIX_ZH if settings.LANGUAGE_CODE.lower().startswith("zh") else SUMMARY_PREFIX_EN
    )


def system_text(*, system_prompt: str, summary: str) -> str:
    if not summary:
        return system_prompt
    return f"{system_prompt}\n\n{summary_prefix()}\n{summary}"


def context_config_for(*, session: ChatSession) -> ContextConfig:
    """Global knobs, then the agent's `config_json["context"]` overrides."""
    cfg: ContextConfig = settings.CHAT_CONTEXT
    agent = session.agent
    overrides = (agent.config_json or {}).get("context") if agent is not None else None
    if overrides:
        try:
            cfg = cfg.with_overrides(overrides, source=f"agent {agent.pk} config_json.context")  # type: ignore[union-attr]
        except Exception as exc:  # validated on save; a hand-edited row must not break sends
            logger.warning("chat_context_config_invalid session=%s error=%s", session.pk, exc)
    return cfg


def base_system_prompt(*, session: ChatSession, query: str = "") -> str:
    agent = session.agent
    prompt = (agent.system_prompt.strip() if agent is not None else "") or DEFAULT_SYSTEM_PROMPT
    extras = [hook(session=session, query=query) for hook in system_prompt_hooks]
    return "\n\n".join([prompt, *[e for e in extras if e]])


def _tail_queryset(session: ChatSession) -> Any:
    """The session's rows from the anchor on. No status condition in SQL: the keyset reads must
    be answerable from chat_msg_session_id_idx alone (a status filter sends PostgreSQL back to
    walking the primary key); the few streaming/failed rows are skipped in Python instead."""
    qs = ChatMessage.objects.filter(session_id=session.pk)
    if session.verbatim_since_message_id is not None:
        qs = qs.filter(id__gte=session.verbatim_since_message_id)
    return qs


def _for_model(rows: Sequence[ChatMessage]) -> Iterator[TailMessage]:
    return (TailMessage.from_row(r) for r in rows if r.status not in _EXCLUDED_STATUSES)


def context_state_read(*, session: ChatSession, query: str = "") -> ContextState:
    """Read the verbatim tail newest-first, stopping at the anchor, at `history_read_limit` rows,
    or once it holds more than the hard limit: a payload can never use more than that, so rows
    beyond it are only ever needed by a compaction (which reads them itself, in chunks)."""
    cfg = context_config_for(session=session)
    prompt = base_system_prompt(session=session, query=query)
    hard = cfg.effective_hard_limit_runes
    budget_left = hard - len(system_text(system_prompt=prompt, summary=session.context_summary))
    newest_first: list[TailMessage] = []
    rows_read = 0
    runes = 0
    backlog = False
    upper: int | None = None
    qs = _tail_queryset(session)
    while True:
        page_qs = qs if upper is None else qs.filter(id__lt=upper)
        take = min(TAIL_PAGE, cfg.history_read_limit - rows_read)
        page = list(message_rows(page_qs, order="-id", limit=take).only(*_TAIL_FIELDS))
        rows_read += len(page)
        for msg in _for_model(page):
            newest_first.append(msg)
            runes += msg.runes
        if len(page) < take:
            break  # reached the anchor
        upper = page[-1].pk
        if runes > budget_left or rows_read >= cfg.history_read_limit:
            backlog = message_exists(_tail_queryset(session).filter(id__lt=upper))
            break
    newest_first.reverse()
    return ContextState(
        session=session,
        cfg=cfg,
        system_prompt=prompt,
        tail=newest_first,
        backlog=backlog,
        rows_read=rows_read,
    )


def context_budget_of(*, state: ContextState) -> dict[str, Any]:
    limit = state.cfg.input_budget_runes
    used = state.runes
    return {
        "used_runes": used,
        "limit_runes": limit,
        "used_pct": round(100.0 * used / limit, 1) if limit else 0.0,
    }


# --------------------------------------------------------------------------------------------
# Cut selection (no model call)
# --------------------------------------------------------------------------------------------


def _turn_starts(tail: Sequence[TailMessage]) -> list[int]:
    """Indexes where a turn starts: a user message. Cutting only there keeps every turn, and every
    assistant tool call with its tool results, on one side of the cut."""
    return [i for i, m in enumerate(tail) if m.role == MessageRole.USER]


def _assumed_summary_runes(*, cfg: ContextConfig, summary: str, fold_runes: int) -> int:
    # A merged summary is usually a fraction of what it absorbs; over-estimating only makes the
    # cut a little deeper, under-estimating would retrigger compaction on the next send.
    return min(cfg.summary_max_runes, len(summary) + fold_runes // 3 + 400)


def context_choose_cut(
    *,
    tail: Sequence[TailMessage],
    system_runes_without_summary: int,
    summary: str,
    cfg: ContextConfig,
    backlog: bool = False,
    force: bool = False,
) -> int | None:
    """Index into `tail`: messages before it are folded into the summary. None: no valid cut.

    Picks the shallowest turn boundary that brings the estimated payload down to the target
    watermark, keeping at least `min_verbatim` messages; if none reaches the target, the deepest
    valid boundary (the most it can do without splitting a turn)."""
    n = len(tail)
    candidates = [i for i in _turn_starts(tail) if n - i >= cfg.min_verbatim]
    if not backlog:
        candidates = [i for i in candidates if i > 0]
    if not candidates:
        return None
    target = cfg.target_runes
    prefix = [0]
    for m in tail:
        prefix.append(prefix[-1] + m.runes)
    for i in candidates:
        folded = prefix[i]
        after = (
            system_runes_without_summary
            + len(summary_prefix())
            + _assumed_summary_runes(cfg=cfg, summary=summary, fold_runes=folded)
            + (prefix[n] - prefix[i])
        )
        if after <= target and not force:
            return i
    # Nothing reaches the target (or "compact now" asked for the most): fold as much as the
    # boundaries and min_verbatim allow.
    return candidates[-1]


# --------------------------------------------------------------------------------------------
# The summarising call
# --------------------------------------------------------------------------------------------

SUMMARY_SYSTEM_PROMPT = f"""{SUMMARY_MARKER}
You maintain the running summary of a long conversation between a user and an assistant. Merge
the new transcript excerpt into the existing summary. Write in the conversation's language.
Keep these sections, in this order, as Markdown headings:
## Facts and decisions
## Open tasks
## User constraints and preferences
## Pending questions
## Exact identifiers
Under "Exact identifiers" copy names, numbers, file paths, URLs, commands and code identifiers
exactly as written. Drop small talk. Never invent anything. Reply with the summary only."""

_ERRORISH = re.compile(
    r"^\s*(error\b|exception\b|traceback\b|internal server error|i'?m sorry|sorry, i can|"
    r"as an ai\b|i cannot\b|i can't\b|\{\s*\"error\")",
    re.IGNORECASE,
)


def _transcript(messages: Sequence[TailMessage]) -> str:
    lines = []
    for m in messages:
        text = m.content
        if m.tool_calls:
            text = f"{text}\n[tool calls: {json.dumps(m.tool_calls, ensure_ascii=False)}]".strip()
        lines.append(f"[#{m.id} {m.role}] {text}")
    return "\n\n".join(lines)


def summary_validate(*, text: str, cap: int) -> str:
    cleaned = text.strip()
    if not cleaned:
        raise SummaryRejected("empty summary")
    if _ERRORISH.search(cleaned[:200]) or "context_length_exceeded" in cleaned:
        raise SummaryRejected(f"summary looks like an error: {cleaned[:80]!r}")
    if len(cleaned) > cap:
        raise SummaryRejected(f"summary has {len(cleaned)} runes, over the cap of {cap}")
    return cleaned


@dataclass(slots=True)
class CallCounter:
    calls: int = 0


def summarise_merge(
    *,
    previous: str,
    messages: Sequence[TailMessage],
    cfg: ContextConfig,
    instructions: str = "",
    counter: CallCounter | None = None,
) -> tuple[str, str]:
    """Merge `messages` into `previous`. Returns (summary, model). Raises LLMError or
    SummaryRejected; never returns an unusable summary. `counter` counts calls, failed ones too."""
    counter = counter if counter is not None else CallCounter()
    provider = get_provider()
    user = (
        f"Existing summary (may be empty):\n{previous or '(none)'}\n\n"
        f"New transcript excerpt:\n{_transcript(messages)}\n\n"
        f"Return the merged summary in at most {cfg.summary_max_runes} characters."
    )
    if instructions:
        user += f"\n\nExtra instructions from the user: {instructions}"
    # The length limit is asked in the prompt and enforced on the result. max_tokens only guards
    # against runaway output: a token is at least one rune, so this never truncates a summary
    # that respects the cap (truncation would cut off the identifiers section at the end).
    max_tokens = cfg.summary_max_runes
    counter.calls += 1
    result = provider.complete(
        messages=[
            {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ],
        model=provider.summary_model,
        max_tokens=max_tokens,
        temperature=0.2,
    )
    text = result.text.strip()
    if len(text) > cfg.summary_max_runes and text and not _ERRORISH.search(text[:200]):
        # Grown past its cap: compress the summary itself once rather than reject outright.
        counter.calls += 1
        shorter = provider.complete(
            messages=[
                {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": (
                        f"Shorten this summary to at most {cfg.summary_max_runes * 9 // 10} "
                        "characters. Keep the sections and every exact identifier.\n\n" + text
                    ),
                },
            ],
            model=provider.summary_model,
            max_tokens=max_tokens,
            temperature=0.2,
        )
        text = shorter.text
    return summary_validate(text=text, cap=cfg.summary_max_runes), result.model


# --------------------------------------------------------------------------------------------
# Lease and compare-and-swap commit
# --------------------------------------------------------------------------------------------


def _lease_claim(*, session_id: int) -> str | None:
    token = secrets.token_hex(8)
    now = timezone.now()
    claimed = (
        ChatSession.objects.filter(pk=session_id)
        .filter(Q(compaction_lease_until__isnull=True) | Q(compaction_lease_until__lt=now))
        .update(
            compaction_lease_token=token,
            compaction_lease_until=now + timedelta(seconds=LEASE_SECONDS),
        )
    )
    return token if claimed else None


def _lease_release(*, session_id: int, token: str) -> None:
    ChatSession.objects.filter(pk=session_id, compaction_lease_token=token).update(
        compaction_lease_token="", compaction_lease_until=None
    )


def _snapshot(*, session: ChatSession, **fields: Any) -> ContextSnapshot:
    return ContextSnapshot.objects.create(session=session, **fields)


def _commit(
    *,
    session: ChatSession,
    expected_version: int,
    summary: str,
    new_anchor: int,
    folded: Sequence[TailMessage],
    snapshot_fields: dict[str, Any],
) -> bool:
    """Summary + anchor + snapshot in one transaction, only if nobody moved the session since we
    read it. Returns False (and records a conflict) when the compare-and-swap loses."""
    with transaction.atomic():
        updated = ChatSession.objects.filter(
            pk=session.pk, context_version=expected_version
        ).update(
            context_summary=summary,
            verbatim_since_message_id=new_anchor,
            context_version=F("context_version") + 1,
        )
        if not updated:
            _snapshot(
                session=session,
                outcome=SnapshotOutcome.CONFLICT,
                covers_from_message_id=folded[0].id,
                covers_to_message_id=folded[-1].id,
                context_version=expected_version,
                **snapshot_fields,
            )
            return False
        _snapshot(
            session=session,
            outcome=SnapshotOutcome.COMMITTED,
            summary=summary,
            covers_from_message_id=folded[0].id,
            covers_to_message_id=folded[-1].id,
            summary_through_message_id=folded[-1].id,
            verbatim_since_message_id=new_anchor,
            context_version=expected_version + 1,
            messages_rolled=len(folded),
            **snapshot_fields,
        )
    session.context_summary = summary
    session.verbatim_since_message_id = new_anchor
    session.context_version = expected_version + 1
    return True


def _run_pre_roll_hooks(*, session: ChatSession, messages: Sequence[TailMessage]) -> None:
    for hook in pre_roll_hooks:
        hook(session=session, messages=messages)


# --------------------------------------------------------------------------------------------
# Compaction
# --------------------------------------------------------------------------------------------


def _chunks_to_fold(
    *, session: ChatSession, state: ContextState, cut: int, input_cap: int
) -> Iterator[tuple[list[TailMessage], int]]:
    """Yield (messages, anchor after them) in chunks the summariser can take in one call.

    Without a backlog the cut is already in memory. With one, the messages between the anchor and
    the in-memory tail are read ascending from the database, a page at a time."""
    cut_anchor = state.tail[cut].id if cut < len(state.tail) else None
    if state.backlog:
        stop = state.tail[0].id
        lower = session.verbatim_since_message_id
        source: Iterator[TailMessage] = _iter_range(session=session, lower=lower, stop=stop)
        source = itertools.chain(source, state.tail[:cut])
    else:
        source = iter(state.tail[:cut])
    chunk: list[TailMessage] = []
    chunk_runes = 0
    for msg in source:
        # Chunks end on a turn boundary unless a single turn is bigger than the cap.
        if chunk and chunk_runes + msg.runes > input_cap and msg.role == MessageRole.USER:
            yield chunk, msg.id
            chunk, chunk_runes = [], 0
        chunk.append(msg)
        chunk_runes += msg.runes
    if chunk:
        assert cut_anchor is not None
        yield chunk, cut_anchor


def _iter_range(*, session: ChatSession, lower: int | None, stop: int) -> Iterator[TailMessage]:
    qs = ChatMessage.objects.filter(session_id=session.pk, id__lt=stop)
    cursor = lower
    while True:
        page_qs = qs if cursor is None else qs.filter(id__gte=cursor)
        page = list(message_rows(page_qs, order="id", limit=TAIL_PAGE).only(*_TAIL_FIELDS))
        yield from _for_model(page)
        if len(page) < TAIL_PAGE:
            return
        cursor = page[-1].pk + 1


def _log_roll(result: RollResult, *, session_id: int) -> None:
    event = {
        "committed": "chat_context_roll",
        "failed": "chat_context_roll_failed",
        "rejected": "chat_context_roll_failed",
        "conflict": "chat_context_roll_conflict",
        "skipped": "chat_context_roll_skipped",
        "busy": "chat_context_roll_skipped",
    }[result.outcome]
    logger.log(
        logging.WARNING if result.outcome in ("failed", "rejected") else logging.INFO,
        "%s session=%s trigger=%s outcome=%s runes_before=%d runes_after=%d rolled=%d calls=%d "
        "rows_read=%d duration_ms=%d%s",
        event,
        session_id,
        result.trigger,
        result.outcome,
        result.runes_before,
        result.runes_after,
        result.messages_rolled,
        result.llm_calls,
        result.rows_read,
        result.duration_ms,
        f" error={result.error!r}" if result.error else "",
    )


def context_needs_roll(*, state: ContextState, reserve_runes: int = 0) -> bool:
    """Over the threshold now, or (with `reserve_runes`, the expected size of the next turn)
    about to be: background compaction asks the second question."""
    cfg = state.cfg
    return state.backlog or state.runes + reserve_runes > min(
        cfg.threshold_runes, cfg.effective_hard_limit_runes
    )


def context_roll_before_call(*, state: ContextState) -> bool:
    """Whether a send compacts before its model call: ours only past the threshold; the seed's
    loop runs on every send (it re-reads its history window each time)."""
    return context_needs_roll(state=state) or state.cfg.strategy == "seed"


def context_roll(
    *,
    session_id: int,
    trigger: Trigger,
    force: bool = False,
    instructions: str = "",
    query: str = "",
    reserve_runes: int = 0,
) -> RollResult:
    """Compact one session if it needs it (or `force`). Safe to call from any thread, any
    process, any number of times at once: the lease and CAS make extra callers no-ops."""
    started = time.monotonic()
    session = ChatSession.objects.select_related("agent").get(pk=session_id)
    state = context_state_read(session=session, query=query)
    result = RollResult(outcome="skipped", trigger=trigger, runes_before=state.runes)
    result.rows_read = state.rows_read
    seed = state.cfg.strategy == "seed"
    if not force and not seed and not context_needs_roll(state=state, reserve_runes=reserve_runes):
        result.runes_after = state.runes
        return result
    token = _lease_claim(session_id=session.pk)
    if token is None:
        result.outcome = "busy"
        result.runes_after = state.runes
        _log_roll(result, session_id=session.pk)
        return result
    try:
        if seed:
            _roll_seed(session=session, result=result, query=query)
        else:
            _roll_cadau(
                session=session,
                state=state,
                result=result,
                force=force,
                instructions=instructions,
                query=query,
            )
    finally:
        _lease_release(session_id=session.pk, token=token)
        result.duration_ms = int((time.monotonic() - started) * 1000)
        _log_roll(result, session_id=session.pk)
    return result


def _fold(
    *,
    session: ChatSession,
    cfg: ContextConfig,
    chunk: list[TailMessage],
    anchor_after: int,
    result: RollResult,
    instructions: str,
    runes_before: int,
) -> int | None:
    """Flush, summarise and commit one chunk. Returns the estimated payload runes afterwards, or
    None when it failed (recorded in a snapshot and the result; nothing moved)."""
    expected_version = session.context_version
    started = time.monotonic()
    counter = CallCounter()
    failure = {
        "trigger": result.trigger,
        "strategy": cfg.strategy,
        "covers_from_message_id": chunk[0].id,
        "covers_to_message_id": chunk[-1].id,
        "context_version": expected_version,
        "runes_before": runes_before,
        "runes_after": runes_before,
    }
    try:
        _run_pre_roll_hooks(session=session, messages=chunk)
        summary, model = summarise_merge(
            previous=session.context_summary,
            messages=chunk,
            cfg=cfg,
            instructions=instructions,
            counter=counter,
        )
    except Exception as exc:
        # Whatever went wrong (flush, provider, unusable summary), nothing may move: the anchor
        # stays, so every message is still verbatim or in the old summary.
        result.llm_calls += counter.calls
        rejected = isinstance(exc, SummaryRejected)
        result.outcome = "rejected" if rejected else "failed"
        result.error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, LLMError | SummaryRejected):
            logger.exception("chat_context_roll_error session=%s", session.pk)
        _snapshot(
            session=session,
            outcome=SnapshotOutcome.REJECTED if rejected else SnapshotOutcome.FAILED,
            llm_calls=counter.calls,
            duration_ms=int((time.monotonic() - started) * 1000),
            error=result.error[:2000],
            **failure,
        )
        return None
    result.llm_calls += counter.calls
    runes_after = max(
        runes_before
        - sum(m.runes for m in chunk)
        - len(session.context_summary)
        + len(summary)
        + (len(summary_prefix()) if not session.context_summary else 0),
        0,
    )
    committed = _commit(
        session=session,
        expected_version=expected_version,
        summary=summary,
        new_anchor=anchor_after,
        folded=chunk,
        snapshot_fields={
            "trigger": result.trigger,
            "strategy": cfg.strategy,
            "runes_before": runes_before,
            "runes_after": runes_after,
            "llm_calls": counter.calls,
            "model": model[:200],
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
    )
    if not committed:
        result.outcome = "conflict"
        return None
    result.outcome = "committed"
    result.messages_rolled += len(chunk)
    return runes_after


def _roll_cadau(
    *,
    session: ChatSession,
    state: ContextState,
    result: RollResult,
    force: bool,
    instructions: str,
    query: str,
) -> None:
    cfg = state.cfg
    prompt_runes = len(state.system_prompt)
    cut = context_choose_cut(
        tail=state.tail,
        system_runes_without_summary=prompt_runes,
        summary=state.summary,
        cfg=cfg,
        backlog=state.backlog,
        force=force,
    )
    if cut is None:
        result.outcome = "skipped"
        result.error = "no turn boundary to cut at without going under min_verbatim"
        result.runes_after = state.runes
        return
    input_cap = max(4000, cfg.input_budget_runes - cfg.summary_max_runes - prompt_runes - 2000)
    runes_now: int | None = state.runes
    for chunk, anchor_after in _chunks_to_fold(
        session=session, state=state, cut=cut, input_cap=input_cap
    ):
        if result.llm_calls >= cfg.max_rounds or runes_now is None:
            break
        runes_now = _fold(
            session=session,
            cfg=cfg,
            chunk=chunk,
            anchor_after=anchor_after,
            result=result,
            instructions=instructions,
            runes_before=runes_now,
        )
    result.runes_after = context_state_read(session=session, query=query).runes


def _roll_seed(*, session: ChatSession, result: RollResult, query: str) -> None:
    """The seed's loop as written (SPEC §3), for comparison: read up to history_read_limit rows,
    then fold the oldest `roll_batch` verbatim messages with one call per batch while the
    estimate is over the threshold or the hard limit, at most `max_rounds` times."""
    cfg = context_config_for(session=session)
    prompt = base_system_prompt(session=session, query=query)
    rows = list(
        message_rows(
            ChatMessage.objects.filter(session_id=session.pk),
            order="-id",
            limit=cfg.history_read_limit,
        )
    )
    rows.reverse()
    result.rows_read = len(rows)
    anchor = session.verbatim_since_message_id
    prior = list(_for_model([r for r in rows if anchor is None or r.pk >= anchor]))
    rounds = 0

    def estimate() -> int:
        return len(system_text(system_prompt=prompt, summary=session.context_summary)) + sum(
            m.runes for m in prior
        )

    while rounds < cfg.max_rounds:
        runes = estimate()
        if runes <= cfg.threshold_runes and runes <= cfg.effective_hard_limit_runes:
            break
        if len(prior) <= cfg.min_verbatim:
            break
        size = min(cfg.roll_batch, len(prior) - cfg.min_verbatim)
        batch, prior = prior[:size], prior[size:]
        rounds += 1
        if (
            _fold(
                session=session,
                cfg=cfg,
                chunk=batch,
                anchor_after=prior[0].id,
                result=result,
                instructions="",
                runes_before=runes,
            )
            is None
        ):
            break
    result.runes_after = estimate()


# --------------------------------------------------------------------------------------------
# Payload
# --------------------------------------------------------------------------------------------


def _trim_to_fit(*, state: ContextState, limit: int) -> tuple[list[TailMessage], int]:
    """Drop the oldest whole turns from this payload only, until it fits under `limit`."""
    tail = state.tail
    system_runes = state.system_runes
    suffix = [0] * (len(tail) + 1)
    for i in range(len(tail) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + tail[i].runes
    if system_runes + suffix[0] <= limit:
        return list(tail), 0
    starts = _turn_starts(tail) or [0]
    for i in starts:
        if system_runes + suffix[i] <= limit:
            return list(tail[i:]), i
    raise PayloadTooLarge(
        f"the newest turn needs {system_runes + suffix[starts[-1]]} runes, over the hard limit "
        f"of {limit}"
    )


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


def context_payload(
    *,
    session_id: int,
    trigger: Trigger = "before_send",
    query: str = "",
    compact: bool = True,
    state: ContextState | None = None,
) -> Payload:
    """Build the messages for the next model call, compacting first when needed (cadau: only past
    the threshold; seed: the seed's loop on every call). Never raises for a failed summary: the
    payload is then trimmed for this call. Raises PayloadTooLarge when nothing can make it fit.
    `state` reuses a tail the caller has just read."""
    rolls: list[RollResult] = []
    if state is None:
        session = ChatSession.objects.select_related("agent").get(pk=session_id)
        state = context_state_read(session=session, query=query)
    if compact and context_roll_before_call(state=state):
        roll = context_roll(session_id=session_id, trigger=trigger, query=query)
        rolls.append(roll)
        if roll.changed:
            session = ChatSession.objects.select_related("agent").get(pk=session_id)
            state = context_state_read(session=session, query=query)
    rows_read = state.rows_read + sum(r.rows_read for r in rolls)
    tail, dropped = _trim_to_fit(state=state, limit=state.cfg.effective_hard_limit_runes)
    if dropped:
        logger.warning(
            "chat_context_payload_trimmed session=%s dropped=%d runes=%d limit=%d",
            session_id,
            dropped,
            state.runes,
            state.cfg.effective_hard_limit_runes,
        )
    tail = _without_orphan_tool_results(tail)
    system = system_text(system_prompt=state.system_prompt, summary=state.summary)
    messages: list[Message] = [{"role": "system", "content": system}]
    messages.extend(m.as_openai() for m in tail)
    return Payload(
        messages=messages,
        runes=len(system) + sum(m.runes for m in tail),
        limit_runes=state.cfg.input_budget_runes,
        dropped=dropped,
        rows_read=rows_read,
        rolls=rolls,
    )


def context_budget_for(*, session: ChatSession) -> dict[str, Any]:
    """`context_budget` for API replies: what the next call would carry, against the budget."""
    return context_budget_of(state=context_state_read(session=session))


def context_state_fresh(*, session_id: int, query: str = "") -> ContextState:
    """`context_state_read` of the session as stored now: a fresh read, since a compaction may
    have moved the summary since the caller last looked."""
    session = ChatSession.objects.select_related("agent").get(pk=session_id)
    return context_state_read(session=session, query=query)


def context_state_appended(*, state: ContextState, message: ChatMessage) -> ContextState | None:
    """What `context_state_fresh` would return once `message`, the session's newest row, is
    stored, worked out from `state` (read earlier in the same turn) without reading anything:
    the `done` budget of 200 replies ending at once was two queries each, GIL time the other
    replies' last tokens waited for (bench/realtime.py).

    Exact only while nothing else moved the context since `state` was read: the caller knows
    (reply_complete's guard on context_version and the agent). Here, it must also be certain
    that a fresh read returns the same rows plus this one: `state`'s read reached the anchor
    within its first page, and `message` was that read's newest row or newer (the reply row,
    read while still streaming, is one of the rows counted). Else None: read fresh."""
    if state.backlog or state.rows_read >= min(TAIL_PAGE, state.cfg.history_read_limit):
        return None
    tail = [m for m in state.tail if m.id != message.pk]
    if tail and tail[-1].id > message.pk:
        return None
    return ContextState(
        session=state.session,
        cfg=state.cfg,
        # As a fresh read builds it (no query): system-prompt hooks may show newer text now.
        system_prompt=base_system_prompt(session=state.session),
        tail=[*tail, *_for_model([message])],
        backlog=False,
        rows_read=0,
    )


def context_budget_read(*, session_id: int) -> dict[str, Any]:
    """`context_budget_for` the session as stored now (`context_state_fresh`)."""
    return context_budget_of(state=context_state_fresh(session_id=session_id))


def context_would_cross_threshold(*, session: ChatSession, next_message_runes: int) -> bool:
    return context_needs_roll(
        state=context_state_read(session=session), reserve_runes=next_message_runes
    )


def context_check_fits(*, session: ChatSession, content: str) -> None:
    """Refuse, before anything is stored, a message that cannot fit the hard limit even alone
    with the system prompt and the summary: compaction could never make room for it."""
    cfg = context_config_for(session=session)
    prompt = base_system_prompt(session=session, query=content)
    needed = len(system_text(system_prompt=prompt, summary=session.context_summary)) + len(content)
    if needed > cfg.effective_hard_limit_runes:
        raise ApiError(
            f"This message is too long for the model's context: it needs about {needed} "
            f"characters with the system prompt and summary; the limit is "
            f"{cfg.effective_hard_limit_runes}.",
            code="message_too_large",
        )


def context_reset(*, session: ChatSession, by: str = "") -> None:
    """Operator action: drop the summary; every message is verbatim again (the next send
    compacts afresh). Recorded as a snapshot, and a CAS bump stops an in-flight compaction
    from committing a summary of the old state on top."""
    with transaction.atomic():
        locked = ChatSession.objects.select_for_update().get(pk=session.pk)
        ChatSession.objects.filter(pk=locked.pk).update(
            context_summary="",
            verbatim_since_message_id=None,
            context_version=F("context_version") + 1,
        )
        _snapshot(
            session=locked,
            outcome=SnapshotOutcome.RESET,
            trigger="admin",
            context_version=locked.context_version + 1,
            error=f"reset by {by}" if by else "",
        )
    logger.info("chat_context_reset session=%s by=%s", session.pk, by)
