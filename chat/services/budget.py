"""The `context_budget` every reply carries: how much of the model's input budget the next call
would use, in runes (characters).

This is a placeholder estimate until the context engine lands: system prompt + summary + the
verbatim tail (messages with id >= the anchor). The engine will replace the internals; the
signature `context_budget_for(*, session) -> dict` is the contract the API relies on.

The session list needs a budget for up to 100 sessions per page; one aggregate per session
would be N+1 queries. `with_context_runes` therefore computes the same estimate inside the
page query (one correlated subquery per row, served by chat_msg_session_id_idx), and
`context_budget_for` uses that annotation when the session carries it. Whoever changes the
estimate must change both, which is why they live side by side here. We chose the annotation
over a stored column because a stored figure must be kept right by every writer (send, tool
loop, compaction, truncation), and nothing writes it yet.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.conf import settings
from django.db.models import IntegerField, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Length

from chat.models import ChatMessage, ChatSession

ANNOTATION = "context_runes_estimate"

_S = TypeVar("_S", bound=QuerySet[ChatSession])


def budget_from_runes(*, used_runes: int) -> dict[str, Any]:
    limit = int(settings.CHAT_CONTEXT.input_budget_runes)
    used = max(0, int(used_runes))
    return {
        "used_runes": used,
        "limit_runes": limit,
        "used_pct": round(used * 100.0 / limit, 1) if limit else 0.0,
    }


def context_budget_for(*, session: ChatSession) -> dict[str, Any]:
    annotated = getattr(session, ANNOTATION, None)
    if annotated is not None:
        return budget_from_runes(used_runes=annotated)
    messages = ChatMessage.objects.filter(session_id=session.pk)
    if session.verbatim_since_message_id is not None:
        messages = messages.filter(id__gte=session.verbatim_since_message_id)
    tail = messages.aggregate(runes=Sum(Length("content")))["runes"] or 0
    # session_for_user select_related()s the agent, so this is no extra query on API paths.
    prompt = len(session.agent.system_prompt) if session.agent_id and session.agent else 0
    return budget_from_runes(used_runes=prompt + len(session.context_summary) + tail)


def with_context_runes(queryset: _S) -> _S:
    """Annotate each session with the same estimate `context_budget_for` computes."""
    tail = (
        ChatMessage.objects.filter(session_id=OuterRef("pk"))
        .filter(Q(id__gte=Coalesce(OuterRef("verbatim_since_message_id"), Value(0))))
        .order_by()
        .values("session_id")
        .annotate(runes=Sum(Length("content")))
        .values("runes")
    )
    return queryset.annotate(
        **{
            ANNOTATION: Coalesce(Length("agent__system_prompt"), Value(0))
            + Length("context_summary")
            + Coalesce(Subquery(tail, output_field=IntegerField()), Value(0))
        }
    )
