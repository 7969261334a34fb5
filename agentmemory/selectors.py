"""Reads of agentmemory that touch chat's rows."""

from __future__ import annotations

from typing import Any

from chat.errors import NotFound
from chat.models import Agent, ChatMessage


def source_message_for(*, user: Any, agent: Agent, message_id: int) -> ChatMessage:
    """The message a "Remember" action points at. It must be in one of the user's own sessions
    with this agent; anything else is the same NotFound as a message that does not exist."""
    message = (
        ChatMessage.objects.filter(pk=message_id, session__owner=user, session__agent=agent)
        .only("id", "session_id", "content")
        .first()
    )
    if message is None:
        raise NotFound("source message not found")
    return message
