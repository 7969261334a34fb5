"""Compaction: one entry point (`context_compact`) for every trigger, and our strategy.

Compaction moves the verbatim anchor forward and merges what it passes into the summary. It
never deletes or edits a message. What ours does better than the seed's loop (chat/context/
seed.py, still selectable for comparison):
- reads only the verbatim tail, newest first and bounded, never the summarised history;
- picks the cut without calling the model, down to a lower target watermark (hysteresis), and
  merges the whole cut with one summarising call (more only past the summariser's input cap);
- cuts only at turn boundaries, so a user/assistant turn and an assistant tool call with its
  results always stay together;
- a lease keeps concurrent sends from paying for the same summary, and compare-and-swap on
  `context_version` keeps them from committing over each other;
- a failed or unusable summary changes nothing: the anchor stays, the payload is trimmed for
  that one call, and the next send retries.

Log lines (operators search for these keys, so they keep their names): chat_context_roll,
chat_context_roll_failed, chat_context_roll_skipped, chat_context_roll_conflict,
chat_context_reset.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from typing import Literal, Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import F

from chat.context.commit import (
    CompactionResult,
    Trigger,
    compact_chunk,
    lease_claim,
    lease_release,
    snapshot_create,
)
from chat.context.cut import context_choose_cut
from chat.context.seed import SeedStrategy
from chat.context.state import (
    TAIL_PAGE,
    ContextState,
    TailMessage,
    context_needs_compaction,
    context_state_read,
    tail_page,
)
from chat.models import ChatSession, MessageRole, SnapshotOutcome

logger = logging.getLogger("chat.context")


class Strategy(Protocol):
    name: str
    # Compacts (or at least checks) on every send, not only past the threshold.
    runs_every_send: bool
    # Compacts in the background after a reply when the next turn would cross the threshold.
    in_background: bool

    def compact(
        self,
        *,
        session: ChatSession,
        state: ContextState,
        result: CompactionResult,
        force: bool,
        instructions: str,
        query: str,
    ) -> None: ...


def _chunks(
    *, session: ChatSession, state: ContextState, cut: int, input_cap: int
) -> Iterator[tuple[list[TailMessage], int]]:
    """Yield (messages, anchor after them) in chunks the summariser can take in one call.

    Without a backlog the cut is already in memory. With one (an import, or a session whose
    summaries kept failing), the messages between the anchor and the in-memory tail are read
    ascending from the database, a page at a time, unless recall is on: then they are passed
    over, archived as they are (recall finds them there, verbatim, when a message needs them),
    and only the in-memory part is summarised. A 10,000-message import cost 94 summarising
    calls of ~50 KB before its payload was steady; now one or two."""
    cut_anchor = state.tail[cut].id if cut < len(state.tail) else None
    if state.backlog and settings.CHAT_CONTEXT_RECALL:
        before = list(state.tail[:cut])
        if sum(m.runes for m in before) < input_cap:
            # A read stopped by its row limit: the cut holds little; the newest of the backlog
            # joins it, so the summary is of something.
            older, _, _, _ = tail_page(
                session_id=session.pk,
                order="-id",
                limit=TAIL_PAGE,
                from_id=session.verbatim_since_message_id,
                below_id=state.tail[0].id,
            )
            before = [*reversed(older), *before]
        newest = _newest_turns(before, runes=2 * input_cap)
        yield from _chunks_of(newest, input_cap=input_cap, cut_anchor=cut_anchor)
        return
    if state.backlog:
        source: Iterator[TailMessage] = itertools.chain(
            _iter_range(
                session=session, lower=session.verbatim_since_message_id, stop=state.tail[0].id
            ),
            state.tail[:cut],
        )
    else:
        source = iter(state.tail[:cut])
    yield from _chunks_of(source, input_cap=input_cap, cut_anchor=cut_anchor)


def _newest_turns(messages: list[TailMessage], *, runes: int) -> Iterator[TailMessage]:
    """The newest whole turns of `messages` within `runes` (at least the newest turn)."""
    starts = [i for i, m in enumerate(messages) if m.role == MessageRole.USER] or [0]
    total, keep = 0, starts[-1]
    for i in reversed(starts):
        total = sum(m.runes for m in messages[i:])
        if total > runes and i != starts[-1]:
            break
        keep = i
    return iter(messages[keep:])


def _chunks_of(
    source: Iterator[TailMessage], *, input_cap: int, cut_anchor: int | None
) -> Iterator[tuple[list[TailMessage], int]]:
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
    cursor = lower
    while True:
        page, last_id, read, _ = tail_page(
            session_id=session.pk, order="id", limit=TAIL_PAGE, from_id=cursor, below_id=stop
        )
        yield from page
        if read < TAIL_PAGE:
            return
        cursor = last_id + 1


class CadauStrategy:
    name = "cadau"
    runs_every_send = False
    in_background = True

    def compact(
        self,
        *,
        session: ChatSession,
        state: ContextState,
        result: CompactionResult,
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
        # What one summarising call may be given: most of the budget, but within a small
        # model window only half of it (the call carries instructions, the summary so far, and
        # needs room to answer).
        floor = cfg.input_budget_runes // 2 if state.binding == "window" else 4000
        input_cap = max(floor, cfg.input_budget_runes - cfg.summary_cap_runes - prompt_runes - 2000)
        runes_now: int | None = state.runes
        for chunk, anchor_after in _chunks(
            session=session, state=state, cut=cut, input_cap=input_cap
        ):
            if result.llm_calls >= cfg.max_rounds or runes_now is None:
                break
            runes_now = compact_chunk(
                session=session,
                cfg=cfg,
                chunk=chunk,
                anchor_after=anchor_after,
                result=result,
                instructions=instructions,
                runes_before=runes_now,
            )
        result.runes_after = context_state_read(
            session=session, query=query, prompt=state.prompt
        ).runes


STRATEGIES: dict[str, Strategy] = {"cadau": CadauStrategy(), "seed": SeedStrategy()}


def context_strategy(*, state: ContextState) -> Strategy:
    return STRATEGIES[state.cfg.strategy]


SendCompaction = Literal["none", "now", "background"]


def context_compaction_decide(
    *, state: ContextState, after_reply: bool = False, reserve_runes: int = 0
) -> SendCompaction:
    """The one decision of when to compact, for a send (before its model call) and after a
    reply ("none", "now": wait for it, "background": no one waits).

    At a send: past the threshold (ours), or always (the seed's loop). With background
    compaction on (the default) ours never makes the user wait for a summary: a session found
    past the threshold (a large message, a failed summary, an import never summarised) is sent
    as it is, trimmed to the hard limit if it must be, and compacted in the background at once.
    Off, or with the seed's loop, the send compacts first and waits.

    After a reply (`reserve_runes`: the expected size of the next turn): in the background,
    when the next turn would cross the threshold, so the next send rarely finds it crossed."""
    strategy = context_strategy(state=state)
    background = settings.CHAT_BACKGROUND_COMPACTION and strategy.in_background
    if after_reply:
        due = background and context_needs_compaction(state=state, reserve_runes=reserve_runes)
        return "background" if due else "none"
    if not (context_needs_compaction(state=state) or strategy.runs_every_send):
        return "none"
    return "background" if background else "now"


def context_compact(
    *,
    session_id: int,
    trigger: Trigger,
    force: bool = False,
    instructions: str = "",
    query: str = "",
    reserve_runes: int = 0,
) -> CompactionResult:
    """Compact one session if it needs it (or `force`). Safe to call from any thread, any
    process, any number of times at once: the lease and CAS make extra callers no-ops."""
    # "Compact now" asked while another compaction committed (or a truncation landed) between
    # its read and its lease reads again: what it read is gone, and it was asked for.
    for _ in range(2 if force else 1):
        result = _compact(
            session_id=session_id,
            trigger=trigger,
            force=force,
            instructions=instructions,
            query=query,
            reserve_runes=reserve_runes,
        )
        if result is not None:
            return result
    # Another caller compacted (or the messages changed) since this one read: its work is
    # done or moot, and the next send decides again from a fresh read.
    result = CompactionResult(outcome="skipped", trigger=trigger)
    _log(result, session_id=session_id)
    return result


def _compact(
    *,
    session_id: int,
    trigger: Trigger,
    force: bool,
    instructions: str,
    query: str,
    reserve_runes: int,
) -> CompactionResult | None:
    """One try of context_compact: None when the session's context moved between the read of
    its state and the claim of its lease."""
    started = time.monotonic()
    session = ChatSession.objects.select_related("agent", "owner").get(pk=session_id)
    state = context_state_read(session=session, query=query)
    result = CompactionResult(outcome="skipped", trigger=trigger, runes_before=state.runes)
    result.rows_read = state.rows_read
    strategy = context_strategy(state=state)
    if (
        not force
        and not strategy.runs_every_send
        and not context_needs_compaction(state=state, reserve_runes=reserve_runes)
    ):
        result.runes_after = state.runes
        return result
    token = lease_claim(session_id=session.pk, version=session.context_version)
    if token is None:
        if not ChatSession.objects.filter(
            pk=session.pk, context_version=session.context_version
        ).exists():
            return None
        result.outcome = "busy"
        result.runes_after = state.runes
        _log(result, session_id=session.pk)
        return result
    try:
        strategy.compact(
            session=session,
            state=state,
            result=result,
            force=force,
            instructions=instructions,
            query=query,
        )
    finally:
        lease_release(session_id=session.pk, token=token)
        result.duration_ms = int((time.monotonic() - started) * 1000)
        _log(result, session_id=session.pk)
    return result


def _log(result: CompactionResult, *, session_id: int) -> None:
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
        snapshot_create(
            session=locked,
            outcome=SnapshotOutcome.RESET,
            trigger="admin",
            context_version=locked.context_version + 1,
            error=f"reset by {by}" if by else "",
        )
    logger.info("chat_context_reset session=%s by=%s", session.pk, by)
