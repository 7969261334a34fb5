"""The chat page and the agents page. Thin: ownership through `session_for_user` and
`agent_for_user`, data from selectors, and the rest is the browser's job (static/chat/*.js
talks to /api/v1 and /ws/chat/)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import Resolver404, resolve
from django.views.decorators.http import require_GET

from chat.api.serializers import SessionSerializer
from chat.models import ChatSession
from chat.selectors import (
    agent_for_user,
    model_provider,
    session_context_config,
    session_default_model,
    session_list,
    session_opened_for_user,
)
from chat.tools import tools_registered
from chat.web.strings import js_strings

# The DOM never holds more than WINDOW_CAP messages, whatever the session's length; pages of
# PAGE_SIZE are loaded on scroll and whole pages are dropped from the far side.
WINDOW_CAP = 150
PAGE_SIZE = 50


def _route_exists(path: str) -> bool:
    # The agents API is built in parallel with this page: its controls appear once it exists.
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def _page_config(*, request: HttpRequest, session: ChatSession | None) -> dict[str, Any]:
    provider = model_provider()
    # The usage ring colours against the threshold that compacts this session (an agent may
    # set its own); the global one where no session is open.
    cfg = session_context_config(session=session)
    return {
        "session": SessionSerializer(session).data if session is not None else None,
        "context_threshold_pct": cfg.threshold_pct,
        "window_cap": WINDOW_CAP,
        "page_size": PAGE_SIZE,
        "provider": {
            "offline": provider["offline"],
            "name": provider["name"],
            "model": provider["model"],
        },
        "features": {"agents": _route_exists("/api/v1/agents")},
        # The chat's model picker: the models the operator allows, and what "default" means
        # here (the agent's model, else the server's).
        "models": list(settings.LLM_ALLOWED_MODELS),
        "default_model": session_default_model(session=session),
        "strings": js_strings(),
        "language": getattr(request, "LANGUAGE_CODE", settings.LANGUAGE_CODE),
    }


def _header(*, session: ChatSession | None, default_model: str) -> dict[str, Any]:
    """What the chat's header says besides its title: the agent it talks to and that agent's
    model (the server's default when the agent names none)."""
    agent = session.agent if session is not None else None
    if agent is None:
        return {"agent": None}
    return {"agent": {"name": agent.name, "model": agent.model or default_model}}


def _render_chat(request: HttpRequest, session: ChatSession | None) -> HttpResponse:
    config = _page_config(request=request, session=session)
    return render(
        request,
        "chat/chat.html",
        {
            "session": session,
            "config": config,
            "provider": config["provider"],
            "header": _header(session=session, default_model=config["provider"]["model"]),
        },
    )


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """`/`: the newest session (its own URL, so a reload stays there), or the empty state."""
    newest = session_list(user=request.user, limit=1).sessions
    if newest:
        return redirect("chat-page", session_id=newest[0].pk)
    return _render_chat(request, None)


@require_GET
@login_required
def chat_page(request: HttpRequest, session_id: int) -> HttpResponse:
    session = session_opened_for_user(user=request.user, session_id=session_id)
    return _render_chat(request, session)


@require_GET
@login_required
def agents_page(request: HttpRequest, agent_id: int | None = None) -> HttpResponse:
    """`/agents/` (the list, "New agent") and `/agents/<id>/` (that agent open: its settings,
    daily notes and long-term memory). Another user's agent is a 404, as in the API."""
    agent = agent_for_user(user=request.user, agent_id=agent_id) if agent_id is not None else None
    tools = sorted(tools_registered().values(), key=lambda tool: tool.name)
    config = {
        "agent_id": agent.pk if agent is not None else None,
        "models": list(settings.LLM_ALLOWED_MODELS),
        "default_model": settings.LLM_MODEL,
        # An agent without a `tools` list gets the built-in ones (chat/tools.py); the form
        # starts from the same.
        "tools": [
            {"name": tool.name, "description": tool.description, "builtin": tool.builtin}
            for tool in tools
        ],
        "strings": js_strings(),
        "language": getattr(request, "LANGUAGE_CODE", settings.LANGUAGE_CODE),
    }
    return render(request, "chat/agents.html", {"agent": agent, "config": config})
