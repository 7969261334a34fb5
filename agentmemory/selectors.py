"""Reads of agentmemory that touch chat's rows."""

from __future__ import annotations

from typing import Any

from chat.errors import NotFound
from chat.models import Agent, ChatMessage, MessageRole


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


# How far back a "remember that" / "remember my name" looks for what it points at.
RECENT_USER_MESSAGES = 6


def user_messages_recent(*, session_id: int, before_id: int) -> list[str]:
    """The texts of the user's messages in the session before message `before_id`, newest
    first, a few at most."""
    rows = ChatMessage.objects.filter(
        session_id=session_id, role=MessageRole.USER, id__lt=before_id
    ).order_by("-id")
    return list(rows.values_list("content", flat=True)[:RECENT_USER_MESSAGES])
