"""The `context_budget` the API shows: how much of the model's input budget the next call would
use, in runes (characters).

One session: the context engine's own figure (`context_budget_from_state` of its state), so the
ring a page shows matches what sends report.

The session list needs a budget for up to 100 sessions per page, and the engine's figure is a
few queries per session: N+1. So the list computes a close estimate inside its page query
instead (`with_context_runes`: one correlated SUM over the newest rows of the verbatim tail,
served by chat_msg_session_id_idx), and `context_budget_from_row` uses it when the session row
carries it. What the estimate leaves out: system-prompt hooks (injected memory, which may read
files) and the JSON of tool calls. We chose this over a stored column because a stored figure
must be kept right by every writer (send, tool loop, compaction, truncation, memory edits).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import IntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Length

from chat.context.prompt import base_prompt, context_config_for, system_text
from chat.context.state import context_budget_from_state, context_state_read
from chat.models import EXCLUDED_FROM_MODEL, ChatMessage, ChatSession

ANNOTATION = "verbatim_tail_runes"
LIST_TAIL_ROWS = 1000

_S = TypeVar("_S", bound=QuerySet[ChatSession])


def budget_from_runes(*, used_runes: int, limit_runes: int) -> dict[str, Any]:
    used = max(0, int(used_runes))
    return {
        "used_runes": used,
        "limit_runes": limit_runes,
        "used_pct": round(used * 100.0 / limit_runes, 1) if limit_runes else 0.0,
    }


def context_budget_from_row(*, session: ChatSession) -> dict[str, Any]:
    """The budget of a loaded session row: from the list annotation when the row carries it
    (`with_context_runes`), else from the context state read for that row."""
    tail = getattr(session, ANNOTATION, None)
    if tail is None:
        return context_budget_from_state(state=context_state_read(session=session))
    # Same composition as the engine's payload, minus hooks: agent prompt (or the default),
    # summary under its prefix, then the verbatim tail. Pure Python on the loaded row.
    system = system_text(
        system_prompt=base_prompt(session=session), summary=session.context_summary
    )
    cfg = context_config_for(session=session)
    return budget_from_runes(used_runes=len(system) + tail, limit_runes=cfg.input_budget_runes)


def with_context_runes(queryset: _S) -> _S:
    """Annotate each session with the rune count of its verbatim tail (id >= anchor, the
    statuses the engine sends), for `context_budget_from_row`. Callers select_related("agent",
    "owner").

    Bounded: only the newest LIST_TAIL_ROWS rows of each tail are summed, chosen through
    chat_msg_session_id_idx (an unbounded SUM took a second per page for a user owning a
    1M-message session that was never compacted). A tail that long is far past any budget
    whatever its exact size, and the next send compacts it."""
    newest_ids = (
        ChatMessage.objects.filter(
            session_id=OuterRef(OuterRef("pk")),
            id__gte=Coalesce(OuterRef(OuterRef("verbatim_since_message_id")), Value(0)),
        )
        .order_by("-id")
        .values("id")[:LIST_TAIL_ROWS]
    )
    tail = (
        ChatMessage.objects.filter(id__in=newest_ids)
        .exclude(status__in=EXCLUDED_FROM_MODEL)
        .order_by()
        .values("session_id")
        .annotate(runes=Sum(Length("content")))
        .values("runes")
    )
    return queryset.annotate(
        **{ANNOTATION: Coalesce(Subquery(tail, output_field=IntegerField()), Value(0))}
    )
