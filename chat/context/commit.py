"""The one step every compaction strategy takes, however it chooses its messages: flush a chunk
to memory (the pre-compaction hooks), merge it into the summary with one summarising call, and
commit summary + anchor + snapshot atomically under compare-and-swap. Plus the lease that keeps
concurrent compactions of a session from paying for the same summary."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from cadau.contextconfig import ContextConfig
from chat.context.heading import summary_block
from chat.context.merge import summary_merge
from chat.context.state import TailMessage
from chat.context.summarise import CallCounter, SummaryRejected
from chat.hooks import pre_compaction_hooks
from chat.llm.base import LLMError
from chat.models import ChatSession, ContextSnapshot, SnapshotOutcome

logger = logging.getLogger("chat.context")

# A summarising call is refused by the lease for this long at most if its holder dies.
LEASE_SECONDS = 300

Trigger = Literal["before_send", "after_reply", "context_error", "manual", "admin"]
Outcome = Literal["committed", "failed", "rejected", "conflict", "skipped", "busy"]


@dataclass(slots=True)
class CompactionResult:
    outcome: Outcome
    trigger: str
    llm_calls: int = 0
    # The snapshot's and the API's name for it.
    messages_rolled: int = 0
    runes_before: int = 0
    runes_after: int = 0
    rows_read: int = 0
    duration_ms: int = 0
    error: str = ""

    @property
    def changed(self) -> bool:
        return self.messages_rolled > 0


def lease_claim(*, session_id: int, version: int) -> str | None:
    """The lease, only while the session is still at the `version` its caller read. A caller
    that read the state just before another one committed and released would otherwise get
    the lease, pay for a summary of what is already summarised and lose at the CAS."""
    token = secrets.token_hex(8)
    now = timezone.now()
    claimed = (
        ChatSession.objects.filter(pk=session_id, context_version=version)
        .filter(Q(compaction_lease_until__isnull=True) | Q(compaction_lease_until__lt=now))
        .update(
            compaction_lease_token=token,
            compaction_lease_until=now + timedelta(seconds=LEASE_SECONDS),
        )
    )
    return token if claimed else None


def lease_release(*, session_id: int, token: str) -> None:
    ChatSession.objects.filter(pk=session_id, compaction_lease_token=token).update(
        compaction_lease_token="", compaction_lease_until=None
    )


def snapshot_create(*, session: ChatSession, **fields: Any) -> ContextSnapshot:
    return ContextSnapshot.objects.create(session=session, **fields)


def _commit(
    *,
    session: ChatSession,
    expected_version: int,
    summary: str,
    new_anchor: int,
    chunk: Sequence[TailMessage],
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
            snapshot_create(
                session=session,
                outcome=SnapshotOutcome.CONFLICT,
                covers_from_message_id=chunk[0].id,
                covers_to_message_id=chunk[-1].id,
                context_version=expected_version,
                **snapshot_fields,
            )
            return False
        snapshot_create(
            session=session,
            outcome=SnapshotOutcome.COMMITTED,
            summary=summary,
            covers_from_message_id=chunk[0].id,
            covers_to_message_id=chunk[-1].id,
            summary_through_message_id=chunk[-1].id,
            verbatim_since_message_id=new_anchor,
            context_version=expected_version + 1,
            messages_rolled=len(chunk),
            **snapshot_fields,
        )
    session.context_summary = summary
    session.verbatim_since_message_id = new_anchor
    session.context_version = expected_version + 1
    return True


def compact_chunk(
    *,
    session: ChatSession,
    cfg: ContextConfig,
    chunk: list[TailMessage],
    anchor_after: int,
    result: CompactionResult,
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
        for hook in pre_compaction_hooks:
            hook(session=session, messages=chunk)
        merged = summary_merge(
            previous=session.context_summary,
            messages=chunk,
            cfg=cfg,
            instructions=instructions,
            counter=counter,
        )
    except Exception as exc:
        # Whatever went wrong (flush, provider, unusable summary), nothing may move: the anchor
        # stays, so every message is still verbatim or in the old summary.
        _failure_record(
            session=session,
            result=result,
            exc=exc,
            counter=counter,
            started=started,
            failure=failure,
        )
        return None
    result.llm_calls += counter.calls
    summary = merged.summary
    runes_after = _runes_after(
        session=session, chunk=chunk, summary=summary, runes_before=runes_before
    )
    committed = _commit(
        session=session,
        expected_version=expected_version,
        summary=summary,
        new_anchor=anchor_after,
        chunk=chunk,
        snapshot_fields={
            "trigger": result.trigger,
            "strategy": cfg.strategy,
            "runes_before": runes_before,
            "runes_after": runes_after,
            "llm_calls": counter.calls,
            "model": merged.model[:200],
            "duration_ms": int((time.monotonic() - started) * 1000),
            # A fallback is committed, not failed: the note says why the model's was not.
            "error": f"summary fallback: {merged.problem}"[:2000] if merged.problem else "",
        },
    )
    if not committed:
        result.outcome = "conflict"
        return None
    result.outcome = "committed"
    result.messages_rolled += len(chunk)
    return runes_after


def _failure_record(
    *,
    session: ChatSession,
    result: CompactionResult,
    exc: Exception,
    counter: CallCounter,
    started: float,
    failure: dict[str, Any],
) -> None:
    """Note a chunk that did not compact in the result and in a snapshot; log the unexpected."""
    result.llm_calls += counter.calls
    rejected = isinstance(exc, SummaryRejected)
    result.outcome = "rejected" if rejected else "failed"
    result.error = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, LLMError | SummaryRejected):
        logger.exception("chat_context_roll_error session=%s", session.pk)
    snapshot_create(
        session=session,
        outcome=SnapshotOutcome.REJECTED if rejected else SnapshotOutcome.FAILED,
        llm_calls=counter.calls,
        duration_ms=int((time.monotonic() - started) * 1000),
        error=result.error[:2000],
        **failure,
    )


def _runes_after(
    *, session: ChatSession, chunk: list[TailMessage], summary: str, runes_before: int
) -> int:
    """The payload's estimated runes once `summary` replaces the session's and the chunk."""
    return max(
        runes_before
        - sum(m.runes for m in chunk)
        # The heading follows the summary's language, which the new summary may have changed.
        - (len(summary_block(summary=session.context_summary)) if session.context_summary else 0)
        + (len(summary_block(summary=summary)) if summary else 0),
        0,
    )
