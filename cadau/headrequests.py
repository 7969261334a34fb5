"""HEAD: the headers GET would send, and not one byte of body.

Daphne writes each body chunk with `twisted.web.http.Request.write(self, ...)`, the class's
method, past the no-op Twisted puts on the request's own `write` for a HEAD once the headers
are out. So only a response's first chunk was left out: the rest of a streamed export, or of
any body over Django's 64 KiB chunk, went onto the connection after the headers, where the
client (or a proxy reusing the connection) reads the next response (a probe: "no response
line received"; a response desync behind such a proxy).

- `bodiless_send` (cadau/asgihandler.py wraps every HEAD's `send` in it): body messages are
  dropped but the last, which goes out empty.
- `HeadWithoutBodyMiddleware`: a streamed body is never started for a HEAD. The throttles
  count GETs, and each HEAD of an export would otherwise read and render the whole session
  only to be thrown away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from django.http import HttpRequest
from django.http.response import HttpResponseBase, StreamingHttpResponse

from cadau.middleware import BothModesMiddleware

Send = Callable[[dict[str, Any]], Awaitable[None]]


def bodiless_send(send: Send) -> Send:
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return sending


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator, of nothing


def _bodiless(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    if request.method == "HEAD" and isinstance(response, StreamingHttpResponse):
        # Not started, so nothing of it ran: a generator's body runs at its first item. Async
        # stays async: under ASGI Django warns when it must drain a sync iterator.
        response.streaming_content = _nothing() if response.is_async else ()
    return response


class HeadWithoutBodyMiddleware(BothModesMiddleware):
    def call(self, request: HttpRequest) -> HttpResponseBase:
        return _bodiless(request, self.get_response(request))

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        return _bodiless(request, await self.get_response(request))
