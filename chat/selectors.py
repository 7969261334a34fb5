"""Reads. The ownership check lives here, once: every route that takes a session or agent id
goes through `session_for_user` / `agent_for_user`, which raise Http404 for anything the user
does not own, so another user's object is indistinguishable from a missing one."""

from __future__ import annotations

from typing import Any

from django.http import Http404

from chat.models import Agent, ChatSession


def _parse_id(value: Any) -> int:
    try:
        parsed = int(value)
    except (TypeError, ValueError):
        raise Http404("Not found.") from None
    if parsed <= 0 or parsed > 2**63 - 1:
        raise Http404("Not found.")
    return parsed


def session_for_user(*, user: Any, session_id: Any, for_update: bool = False) -> ChatSession:
    """The user's session, or Http404. `for_update` locks the row (callers hold a transaction)."""
    if user is None or not user.is_authenticated:
        raise Http404("Not found.")
    qs = ChatSession.objects.select_related("agent")
    if for_update:
        qs = qs.select_for_update(of=("self",))
    try:
        return qs.get(pk=_parse_id(session_id), owner=user)
    except ChatSession.DoesNotExist:
        raise Http404("Not found.") from None


def agent_for_user(*, user: Any, agent_id: Any) -> Agent:
    if user is None or not user.is_authenticated:
        raise Http404("Not found.")
    try:
        return Agent.objects.get(pk=_parse_id(agent_id), owner=user)
    except Agent.DoesNotExist:
        raise Http404("Not found.") from None
