"""WebSocket routes (cadau/asgi.py wraps them in the origin check and Django auth)."""

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from chat.consumers import CLOSE_NOT_FOUND, ChatConsumer


class NoRouteConsumer(AsyncWebsocketConsumer):
    """Every other WebSocket path: refused at the handshake, as an unknown session is. Without
    it Channels' router raised ValueError, which Daphne answered with a 500 and an ERROR
    traceback in the log, for a handshake anyone can send without logging in."""

    async def connect(self) -> None:
        await self.close(code=CLOSE_NOT_FOUND)


websocket_urlpatterns: list[Any] = [
    # str, not int: a malformed id gets the same 4404 as an unknown one.
    path("ws/chat/<str:session_id>/", ChatConsumer.as_asgi()),
    re_path(r"", NoRouteConsumer.as_asgi()),
]
