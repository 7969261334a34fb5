"""Helpers that run one scenario through the sync or the async half of a provider, so every
behaviour is checked on both (they share a codec, but not their I/O loops)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chat.llm import get_provider
from chat.llm.base import Completion, LLMProvider, StreamEvent
from chat.llm.openai_compat import OpenAICompatProvider

USER_HI = [{"role": "user", "content": "one two three four five six"}]


@pytest.fixture
def provider(fake_llm) -> OpenAICompatProvider:
    built = get_provider()
    assert isinstance(built, OpenAICompatProvider)
    return built


@pytest.fixture(params=["sync", "async"])
def mode(request) -> str:
    return str(request.param)


def complete(provider: LLMProvider, mode: str, **kwargs: Any) -> Completion:
    if mode == "sync":
        return provider.complete(**kwargs)
    return asyncio.run(provider.acomplete(**kwargs))


def stream(
    provider: LLMProvider, mode: str, *, seen: list[StreamEvent] | None = None, **kwargs: Any
) -> list[StreamEvent]:
    """All events of one streamed reply. `seen` collects events as they arrive, so a test can
    inspect what was yielded before an exception."""
    events = seen if seen is not None else []
    if mode == "sync":
        for event in provider.stream_chat(**kwargs):
            events.append(event)
        return events

    async def collect() -> None:
        async for event in provider.astream_chat(**kwargs):
            events.append(event)

    asyncio.run(collect())
    return events
