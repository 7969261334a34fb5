"""WebSocket routes (cadau/asgi.py wraps them in the origin check and Django auth)."""

from typing import Any, cast

from django.urls import path, re_path

from chat.consumers import CLOSE_NOT_FOUND, ChatConsumer


async def no_route(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every other WebSocket path: refused at the handshake (4404; a browser sees 403), as an
    unknown session is. Without it Channels' router raised ValueError, which Daphne answered
    with a 500 and an ERROR traceback, for a handshake anyone can send without logging in. A
    bare ASGI function, not a consumer: a consumer would start reading the channel layer
    (Redis), and a Redis that is down would bring the traceback back."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": CLOSE_NOT_FOUND})


websocket_urlpatterns: list[Any] = [
    # str, not int: a malformed id gets the same 4404 as an unknown one.
    path("ws/chat/<str:session_id>/", ChatConsumer.as_asgi()),
    # (Channels' URLRouter takes any ASGI application; django-stubs types a route's target as
    # a Django view.)
    re_path(r"", cast(Any, no_route)),
]
