"""Compactions outside a send, with the `compaction` events every socket of the session sees:
in the background after a reply, "compact now" (API), and the admin's action."""

from __future__ import annotations

from typing import Any

from chat.context import (
    CompactionResult,
    Trigger,
    context_budget_from_db,
    context_budget_from_row,
    context_compact,
)
from chat.errors import CompactionFailed, CompactionInProgress, NotFound
from chat.events import event_publish_now
from chat.models import ChatSession
from chat.shapes import compaction_ended_event, compaction_started_event


def compaction_event_state(outcome: str) -> str:
    """The `compaction` event's state for an outcome: `done` when the summary moved, `failed`
    when it could not be made, `skipped` when nothing was compacted for another reason
    (nothing to cut, another compaction running, the session moved meanwhile)."""
    if outcome == "committed":
        return "done"
    return "failed" if outcome in ("failed", "rejected") else "skipped"


def compaction_event_end(
    result: CompactionResult, *, budget: dict[str, Any] | None
) -> dict[str, Any]:
    """The `compaction` event that ends one: its state, the outcome it stands for (so a page
    can say what happened, not only that something did), and the budget afterwards (so the
    usage ring never waits for the next reply to catch up)."""
    return compaction_ended_event(
        state=compaction_event_state(result.outcome),
        outcome=result.outcome,
        messages_rolled=result.messages_rolled,
        context_budget=budget,
    )


def _budget_now(session_id: int) -> dict[str, Any] | None:
    try:
        return context_budget_from_db(session_id=session_id)
    except ChatSession.DoesNotExist:
        return None  # deleted meanwhile: nobody is left to show it to


def session_compact(
    *,
    session_id: int,
    trigger: Trigger,
    force: bool = False,
    instructions: str = "",
    reserve_runes: int = 0,
) -> CompactionResult:
    event_publish_now(session_id=session_id, event=compaction_started_event())
    result = context_compact(
        session_id=session_id,
        trigger=trigger,
        force=force,
        instructions=instructions,
        reserve_runes=reserve_runes,
    )
    event_publish_now(
        session_id=session_id,
        event=compaction_event_end(result, budget=_budget_now(session_id)),
    )
    return result


def session_compact_now(*, session_id: int, instructions: str = "") -> CompactionResult:
    """ "Compact now": as much as the turn boundaries allow, whatever the threshold. Raises
    CompactionInProgress when another compaction holds the session, CompactionFailed when the
    summary could not be made (nothing changed then)."""
    result = session_compact(
        session_id=session_id, trigger="manual", force=True, instructions=instructions
    )
    if result.outcome == "busy":
        raise CompactionInProgress("A compaction of this session is already running.")
    if result.outcome in ("failed", "rejected"):
        # The model server's words stay in the snapshot (the admin) and the log line.
        raise CompactionFailed("The summary could not be made; nothing changed. Try again later.")
    return result


def compaction_report(*, session_id: int, result: CompactionResult) -> dict[str, Any]:
    """What "compact now" answers: the outcome and the session's context afterwards. NotFound
    when the session was deleted while it compacted."""
    session = ChatSession.objects.filter(pk=session_id).first()
    if session is None:
        raise NotFound()
    return {
        "outcome": result.outcome,
        "messages_rolled": result.messages_rolled,
        "llm_calls": result.llm_calls,
        "context_summary": session.context_summary,
        "verbatim_since_message_id": session.verbatim_since_message_id,
        "context_budget": context_budget_from_row(session=session),
    }
