"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import asyncio
import gc
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")

# Django must be set up before anything imports models (the websocket routing does).
django.setup(set_prefix=False)

from cadau.asgihandler import ASGIHandler  # noqa: E402

# Django's, with a sync view served in one hop to a worker thread (cadau/asgihandler.py).
django_asgi_app = ASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from cadau.bodylimit import BodySizeLimit  # noqa: E402
from cadau.origins import SameOriginValidator  # noqa: E402
from cadau.querytext import QueryTextCheck  # noqa: E402
from chat.consumers import SERVER_SEND  # noqa: E402
from chat.llm.transport import mark_loop_long_lived  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402

router = ProtocolTypeRouter(
    {
        # Refused before Django would read all of it (cadau/bodylimit.py); an API query string
        # that is not UTF-8 before Django reads it as U+FFFD (cadau/querytext.py).
        "http": QueryTextCheck(
            BodySizeLimit(django_asgi_app, max_bytes=settings.HTTP_MAX_BODY_BYTES)
        ),
        # Scheme, host and port of the Origin, not just the host (cadau/origins.py).
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Every view imported now rather than at its first request, so that it is frozen below.
get_resolver().url_patterns  # noqa: B018
# What is loaded by now lives as long as the process: out of the cyclic collector's sight, or
# every full collection walks it (~140k objects) with the GIL held while a first token waits
# (docs/benchmarks.md, "Time to first token").
gc.collect()
gc.freeze()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # The loop serving requests lives as long as the process: the LLM client may keep a pooled
    # aiohttp session on it (chat/llm/transport.py says why only there).
    mark_loop_long_lived(asyncio.get_running_loop())
    if scope["type"] == "websocket":
        # The server's own send, past the middlewares' wrappers (ChatConsumer.connect says why).
        scope = {**scope, SERVER_SEND: send}
    await router(scope, receive, send)
