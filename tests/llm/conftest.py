"""Helpers that run one streamed reply through each I/O path of `astream_chat`, so every
stream behaviour is checked on both (they share a codec, not their transport): `async`
(httpx.AsyncClient on a short-lived loop: httpx's own transport) and `aiohttp` (the same client
on a loop marked as a server's: the aiohttp transport, chat/llm/transport.py). `complete` has
one path (httpx.Client), so its tests call it directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chat.llm import get_provider
from chat.llm.base import LLMProvider, StreamEvent
from chat.llm.openai_compat import OpenAICompatProvider
from chat.llm.transport import mark_loop_long_lived
from tests.helpers import loop_transports_close

USER_HI = [{"role": "user", "content": "one two three four five six"}]


@pytest.fixture
def provider(fake_llm) -> OpenAICompatProvider:
    built = get_provider()
    assert isinstance(built, OpenAICompatProvider)
    return built


@pytest.fixture(params=["async", "aiohttp"])
def mode(request) -> str:
    return str(request.param)


def run(mode: str, coro: Any) -> Any:
    """Run `coro` in a fresh loop; in `aiohttp` mode one marked as a server's (and its
    transports closed before it ends, as the provider's clients outlive a single call)."""
    if mode != "aiohttp":
        return asyncio.run(coro)

    async def served() -> Any:
        mark_loop_long_lived(asyncio.get_running_loop())
        try:
            return await coro
        finally:
            await loop_transports_close()

    return asyncio.run(served())


def stream(
    provider: LLMProvider, mode: str, *, seen: list[StreamEvent] | None = None, **kwargs: Any
) -> list[StreamEvent]:
    """All events of one streamed reply. `seen` collects events as they arrive, so a test can
    inspect what was yielded before an exception."""
    events = seen if seen is not None else []

    async def collect() -> None:
        async for event in provider.astream_chat(**kwargs):
            events.append(event)

    run(mode, collect())
    return events
