"""Django's ASGI handler, with a sync view served as WSGI would serve it: the whole middleware
chain and the view in one go, on one thread.

Why: under ASGI Django runs each hook of a sync middleware on a thread through sync_to_async
and comes back to the event loop in between. With this project's MIDDLEWARE that is about
fifteen crossings per request, each queued behind whatever the loop is doing, then one more
for the view: most of what a REST send added to the model's time to first token over what the
WebSocket adds (bench ttft). Here Django's own sync handler (the same MIDDLEWARE, the same
order, the same exception handling) runs in one hop to a pool of HTTP_THREADS threads, which
keep their database connections (a thread started per request opened one per request).

An async view (none today) keeps Django's async chain. A sync view whose rest must be awaited
on the loop returns a DeferredResponse (cadau/deferred.py), resolved here after the hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.db import close_old_connections
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import get_resolver
from django.utils.log import log_response

from cadau.deferred import (
    RESOLVED_ON_LOOP,
    SERVING_LOOP,
    DeferredResponse,
    deferred_resolve,
    headers_carry,
)
from cadau.headrequests import bodiless_send

# Set in a request's scope by ASGIHandler.__call__ when the view it resolves to is sync.
_SYNC_VIEW = "cadau.sync_view"


def _view_is_async(path: str) -> bool:
    try:
        match = get_resolver().resolve(path)
    except Exception:  # Resolver404, or a converter's error: the sync chain answers it properly
        return False
    return iscoroutinefunction(match.func)


class ASGIHandler(DjangoASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for async views
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)
        threads = ThreadPoolExecutor(
            max_workers=settings.HTTP_THREADS, thread_name_prefix="cadau-http"
        )
        self._serve: Callable[..., Any] = database_sync_to_async(
            self._get_response_sync, thread_sensitive=False, executor=threads
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "HEAD":
            send = bodiless_send(send)  # cadau/headrequests.py: Daphne would send the body
        if scope["type"] == "http" and not _view_is_async(scope["path"]):
            # Django wraps every request in a ThreadSensitiveContext: a thread created for the
            # request's thread-sensitive sync calls, and another to join it at the end. Here
            # those calls are only Django's request_started/finished receivers (the view and
            # everything of ours run on the pool below, thread_sensitive=False), so they go
            # to asgiref's one long-lived thread instead: two thread starts per request fewer.
            # The scope remembers the answer for get_response_async (one URL resolve).
            await self.handle({**scope, _SYNC_VIEW: True}, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _get_response_sync(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return self._sync.get_response(request)
        finally:
            # Inside the call's own context, as chat/workers.py's in_worker says why.
            close_old_connections()

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if not getattr(request, "scope", {}).get(_SYNC_VIEW):
            return await super().get_response_async(request)
        request.META[RESOLVED_ON_LOOP] = True
        request.META[SERVING_LOOP] = asyncio.get_running_loop()
        response: HttpResponseBase = await self._serve(request)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # The client left while the view ran, and asgiref let the view finish (its sync
            # code handled the cancellation: chat/events.py group_send_from_sync): nothing is
            # left to answer, and a reply streamed or awaited for no one would run on.
            raise asyncio.CancelledError
        if not isinstance(response, DeferredResponse):
            return response
        try:
            final = await deferred_resolve(response)
        except Exception as exc:
            # Past the middleware's exception handling: a crash becomes the same 500 (logged,
            # the URLconf's handler500, the middleware's headers) a crash in the view would.
            failed = await sync_to_async(response_for_exception, thread_sensitive=False)(
                request, exc
            )
            return headers_carry(response, failed)
        if final.status_code >= 400:
            # Django logged the placeholder's 202, not this (a queued send's 409, say).
            await sync_to_async(log_response, thread_sensitive=False)(
                "%s: %s",
                final.reason_phrase,
                request.path,
                response=final,  # type: ignore[arg-type]  # any response (Django passes them all)
                request=request,
            )
        return final
