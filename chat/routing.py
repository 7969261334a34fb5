"""WebSocket routes (cadau/asgi.py wraps them in the origin check and Django auth)."""

from typing import Any

from django.urls import path

from chat.consumers import ChatConsumer

websocket_urlpatterns: list[Any] = [
    # str, not int: a malformed id gets the same 4404 as an unknown one.
    path("ws/chat/<str:session_id>/", ChatConsumer.as_asgi()),
]
