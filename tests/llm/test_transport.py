"""chat/llm/transport.py: the aiohttp transport under httpx on the server's loop. (Its error
mapping is covered by every streamed scenario in `aiohttp` mode, tests/llm/conftest.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx

from chat.llm import transport


def test_the_body_is_read_straight_off_aiohttps_stream(fake_llm_server):
    """The fast path depends on a private attribute of httpx-aiohttp: if an upgrade moves it,
    this fails instead of the server silently going back to the slower wrapped iterator."""

    async def fetch() -> tuple[object, bytes]:
        async with transport.AiohttpTransport(limits=httpx.Limits()) as aio:
            request = httpx.Request("GET", f"{fake_llm_server.base_url}/models")
            response = await aio.handle_async_request(request)
            assert isinstance(response.stream, transport._Body)
            content = response.stream._content
            body = b"".join([chunk async for chunk in response.stream])
            await response.aclose()
            return content, body

    content, body = asyncio.run(fetch())
    assert isinstance(content, aiohttp.StreamReader)
    assert b"fake-chat" in body


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


@contextlib.asynccontextmanager
async def _streamed_from(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[transport._Body]:
    """The body of a GET answered by `serve` (a raw server on loopback), through the aiohttp
    transport; closed on the way out (again, if the test closed it)."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with transport.AiohttpTransport(limits=httpx.Limits()) as aio:
            request = httpx.Request("GET", f"http://127.0.0.1:{port}/stream")
            response = await aio.handle_async_request(request)
            assert isinstance(response.stream, transport._Body)
            try:
                yield response.stream
            finally:
                await response.aclose()
    finally:
        server.close()
        await server.wait_closed()


def test_what_arrived_before_a_hang_up_is_read_before_the_error():
    """A server writes two chunks and hangs up mid-body while the reader is busy elsewhere (the
    stream pauses after a reply's first token): the second chunk is handed over, then the
    error, as httpx's own transport does. aiohttp alone raised first and dropped it."""
    first_read = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_SSE_HEAD + b"6\r\nalpha \r\n")
        await writer.drain()
        await first_read.wait()
        writer.write(b"5\r\nbeta \r\n")  # no terminating chunk: the body ends mid-stream
        await writer.drain()
        writer.close()

    async def fetch() -> tuple[list[bytes], BaseException | None]:
        chunks: list[bytes] = []
        error: BaseException | None = None
        async with _streamed_from(serve) as stream:
            try:
                async for chunk in stream:
                    chunks.append(chunk)
                    if not first_read.is_set():
                        first_read.set()
                        await asyncio.sleep(0.2)  # the rest and the hang-up arrive meanwhile
            except httpx.HTTPError as exc:
                error = exc
        return chunks, error

    chunks, error = asyncio.run(fetch())
    assert b"".join(chunks) == b"alpha beta "
    assert isinstance(error, httpx.RemoteProtocolError)


def test_closing_a_live_stream_hangs_up_on_the_server():
    """A reply stopped mid-stream (the user's stop, a cancelled send) closes its connection:
    the model server sees the hang-up at once and stops generating, instead of holding its
    slot (and the pool's connection) until the response is garbage collected."""
    hung_up = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_SSE_HEAD)
        try:
            while True:  # a model that generates a token every 10 ms until the client leaves
                writer.write(b"6\r\ntoken \r\n")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 0.01) == b"":
                        break
                except TimeoutError:
                    pass
        except (ConnectionError, OSError):
            pass
        hung_up.set()

    async def run() -> bool:
        async with _streamed_from(serve) as stream:
            async for _chunk in stream:
                break
            await stream.aclose()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hung_up.wait(), 2.0)
            return hung_up.is_set()

    assert asyncio.run(run())
