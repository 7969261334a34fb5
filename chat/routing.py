"""WebSocket routes (the realtime consumer lands with the realtime issue)."""

from typing import Any

websocket_urlpatterns: list[Any] = []
