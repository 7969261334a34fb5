"""chat/llm/transport.py: the aiohttp transport under httpx on the server's loop. (Its error
mapping is covered by every streamed scenario in `aiohttp` mode, tests/llm/conftest.py.)"""

from __future__ import annotations

import asyncio

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
