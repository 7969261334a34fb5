"""A sync view's response whose rest must be awaited on the event loop.

A sync view runs on a worker thread (cadau/asgihandler.py), and a few of them have work left
that takes seconds but no thread: waiting for a session's running reply to end, generating a
whole reply for a JSON caller. Such a view returns `DeferredResponse(then)`; `then` is awaited
on the loop and its response is sent instead. The middleware has already processed the
placeholder as it would any response, so what it set there (security headers, a session or
CSRF cookie, Vary) is carried over to the response sent.

Who awaits it: our ASGI handler, back on the loop after the view's thread returned; under any
other handler (Django's test client, a sync server) `DeferredResponseMiddleware`, first in
MIDDLEWARE so it sees the placeholder after every other middleware has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.cache import cc_delim_re, patch_vary_headers

from cadau.middleware import BothModesMiddleware

#: Set on a request by a handler that resolves deferred responses itself, on its loop.
RESOLVED_ON_LOOP = "cadau.deferred_resolved_on_loop"
#: Set on a request by that handler too: the loop it will send the response from.
SERVING_LOOP = "cadau.serving_loop"
# Describe the placeholder's own (empty) body, not the one sent.
_NOT_CARRIED = {
    "content-type",
    "content-length",
    "content-encoding",
    "content-range",
    "etag",
    "last-modified",
}


def serving_loop(request: HttpRequest) -> asyncio.AbstractEventLoop | None:
    """The event loop that will send `request`'s response, for a sync view to start work
    there at once (with `call_soon_threadsafe`); None under a handler that sets none (the
    test client, a sync server)."""
    loop = request.META.get(SERVING_LOOP)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


class DeferredResponse(HttpResponse):
    """Never sent: `then` gives the response to send (or another DeferredResponse)."""

    def __init__(self, then: Callable[[], Awaitable[HttpResponseBase]]) -> None:
        super().__init__(status=202, content_type="application/json")
        self.then = then


def headers_carry(placeholder: HttpResponseBase, response: HttpResponseBase) -> HttpResponseBase:
    """`response` with what the middleware set on `placeholder` (it never saw `response`)."""
    for name, value in placeholder.items():
        lowered = name.lower()
        if lowered in _NOT_CARRIED:
            continue
        if lowered == "vary":
            patch_vary_headers(response, cc_delim_re.split(value))
        elif name not in response:
            response[name] = value
    # CommonMiddleware's rule, for the body it did not see.
    if (
        "Content-Length" in placeholder
        and isinstance(response, HttpResponse)
        and "Content-Length" not in response
    ):
        response["Content-Length"] = str(len(response.content))
    for key, morsel in placeholder.cookies.items():
        if key not in response.cookies:
            response.cookies[key] = morsel
    # The handler closes only the response it sends: the request's own closers go with it.
    closers = placeholder._resource_closers  # type: ignore[attr-defined]
    response._resource_closers.extend(closers)  # type: ignore[attr-defined]
    closers.clear()
    return response


async def deferred_resolve(response: HttpResponseBase) -> HttpResponseBase:
    """`response`, or what its deferred work gave, with the middleware's headers carried."""
    while isinstance(response, DeferredResponse):
        response = headers_carry(response, await response.then())
    return response


class DeferredResponseMiddleware(BothModesMiddleware):
    """Resolves a DeferredResponse where no handler does it on its loop. First in MIDDLEWARE."""

    def call(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = self.get_response(request)
        if isinstance(response, DeferredResponse) and not request.META.get(RESOLVED_ON_LOOP):
            response = async_to_sync(deferred_resolve)(response)
        return response

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        return await deferred_resolve(await self.get_response(request))
