"""Session events (SPEC's WebSocket contract) fan out through the channel layer group of the
session, so every socket in every process sees the same stream. Only services publish, and
events that announce stored rows go out after the transaction commits."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("chat.events")


def session_group(session_id: int) -> str:
    return f"chat_session_{session_id}"


def _envelope(event: dict[str, Any]) -> dict[str, Any]:
    # `type` routes to the consumer's handler; the contract event rides inside untouched.
    return {"type": "chat.event", "event": event}


def event_publish_now(*, session_id: int, event: dict[str, Any]) -> None:
    """Publish from sync code. A broken channel layer must never fail a stored message."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(session_id), _envelope(event))
    except Exception:
        logger.exception(
            "chat_event_publish_failed session=%s type=%s", session_id, event.get("type")
        )


def event_publish_on_commit(*, session_id: int, event: dict[str, Any]) -> None:
    transaction.on_commit(lambda: event_publish_now(session_id=session_id, event=event))


async def event_publish_async(*, session_id: int, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(session_group(session_id), _envelope(event))
    except Exception:
        logger.exception(
            "chat_event_publish_failed session=%s type=%s", session_id, event.get("type")
        )
