"""The HTTP transport under the async LLM client on the server's event loop.

Why not httpx's own: a streamed reply is one small SSE chunk every few tens of milliseconds per
open reply, and httpx's default stack (httpcore + anyio + h11, all pure Python, with a cancel
scope and an epoll re-registration per socket read) costs ~140 µs of CPU per chunk. With 200
replies streaming at once that alone is more than one core (bench/realtime.py). aiohttp reads
the same stream with its C parser straight off an asyncio protocol: ~70 µs, about what a bare
asyncio reader costs. `httpx-aiohttp` plugs aiohttp in under the httpx API, so the client code,
its timeouts and its tests stay the same.

Why only on long-lived loops: an aiohttp session must be closed on its own loop, and the loops
asgiref makes for sync callers (management commands, tests) end before anyone could close it.
Those keep httpx's default transport, which needs no closing. The ASGI application marks the
server's loop (`mark_loop_long_lived`, cadau/asgi.py).

The errors: httpx-aiohttp maps every aiohttp connection error to `ConnectTimeout` (a refused
connection or a peer that hangs up mid-stream would read as a timeout) and lets some through
unmapped. `AiohttpTransport` maps them by what happened, to the httpx exceptions the client
already handles.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator

import aiohttp
import httpx
import httpx_aiohttp

_long_lived: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
# Every aiohttp transport still open, by the loop it lives on: a provider replaced after a
# configuration change drops its client, but the transport must still be closed on its loop.
_open: dict[asyncio.AbstractEventLoop, set[AiohttpTransport]] = {}


def mark_loop_long_lived(loop: asyncio.AbstractEventLoop) -> None:
    """This loop runs as long as the process (the ASGI server's): it gets pooled aiohttp."""
    _long_lived.add(loop)


def loop_is_long_lived(loop: asyncio.AbstractEventLoop) -> bool:
    return loop in _long_lived


# What the library lets through: its own httpx mapping, or aiohttp's errors unmapped.
_RAISED = (httpx.HTTPError, aiohttp.ClientError, TimeoutError)


def _httpx_error(exc: BaseException, request: httpx.Request) -> httpx.HTTPError:
    """The httpx exception for what aiohttp (or the library's first mapping of it) raised."""
    root = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ else exc
    message = str(root) or type(root).__name__
    kind: type[httpx.TransportError]
    if isinstance(root, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(root, aiohttp.ServerTimeoutError | TimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(root, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        kind = httpx.ProxyError
    elif isinstance(root, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(root, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        kind = httpx.RemoteProtocolError
    elif isinstance(root, aiohttp.NonHttpUrlClientError | aiohttp.InvalidUrlClientError):
        kind = httpx.UnsupportedProtocol
    elif isinstance(root, httpx.TransportError):
        return root
    else:
        kind = httpx.ReadError
    return kind(message, request=request)


class _Body(httpx.AsyncByteStream):
    """The response body, errors mapped. Reads aiohttp's stream itself when it can reach it,
    whatever has arrived at each step (`iter_any`): one async generator per chunk instead of
    the library's and a wrapper around it, and a chunk is one token of a streamed reply."""

    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._inner = inner
        self._request = request
        # httpx-aiohttp keeps the aiohttp response here (not public API: without it, the
        # library's own iterator is used, wrapped).
        self._content = getattr(getattr(inner, "_aiohttp_response", None), "content", None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if isinstance(self._content, aiohttp.StreamReader):
                async for chunk in self._content.iter_any():
                    yield chunk
            else:
                async for chunk in self._inner:
                    yield chunk
        except _RAISED as exc:
            left = _unread(self._content)
            if left:
                yield left
            raise _httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


def _unread(content: aiohttp.StreamReader | None) -> bytes:
    """What arrived before the peer hung up and was not read yet.

    Why: aiohttp's reads raise a broken connection's error before they look at the buffer, so
    the tokens that came in the same moment as the hang-up were dropped unread (a reply cut
    after "alpha beta" stored "alpha " when the reader had not run between the two). httpx's
    own transport hands them over first, then raises; so does this one. The buffer is not
    public API: if an upgrade moves it, nothing is salvaged and the error is raised as before
    (tests/llm/test_transport.py fails)."""
    if content is None or not getattr(content, "_buffer", None):
        return b""
    try:
        return content._read_nowait(-1)
    except (AttributeError, TypeError, RuntimeError, TimeoutError):
        return b""  # salvage only: the connection's own error is raised next


class AiohttpTransport(httpx_aiohttp.AiohttpTransport):
    """Made inside the loop it serves (the session is created there on first use)."""

    def __init__(self, *, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        self._loop = asyncio.get_running_loop()
        _open.setdefault(self._loop, set()).add(self)

    async def aclose(self) -> None:
        _open.get(self._loop, set()).discard(self)
        await super().aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except _RAISED as exc:
            raise _httpx_error(exc, request) from exc
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Body(response.stream, request)
        return response
