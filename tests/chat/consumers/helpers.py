"""Helpers shared by the consumer tests in this folder (their fixtures are in conftest.py): a
socket through the real ASGI application, a login cookie, the stored messages, a reply's text
and waiting for the replies sockets started."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from cadau.asgi import application
from chat.models import ChatMessage
from chat.turn import service

ORIGIN = b"http://localhost"
TIMEOUT = 5.0


def cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def socket_to(
    session_id: Any, *, cookie: str | None, origin: bytes | None = ORIGIN
) -> WebsocketCommunicator:
    # A browser always sends Host; the Origin check compares the Origin with it.
    headers = [(b"host", b"localhost")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/chat/{session_id}/", headers=headers)


async def replies_settle() -> None:
    """Wait for replies started by sockets (they outlive the socket on purpose)."""
    if service._tasks:
        await asyncio.wait_for(
            asyncio.gather(*list(service._tasks), return_exceptions=True), TIMEOUT
        )


def _messages(session_id: int) -> list[ChatMessage]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id"))


messages_of = database_sync_to_async(_messages)


def delta_text(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")
