"""The provider against a real OpenAI-compatible server (llama-cpp-python serving SmolLM2-135M
at n_ctx 1024: tests/fixtures_real_llm.py), and how that server fails. What these tests pin is
written up in docs/real-llm-notes.md; the fake server copies each shape (devtools.fakellm) so
the fast suite covers them too.

Wire shapes are read with a bare httpx client; the provider's reading of them with the
provider, streams on each of its I/O paths (`mode`)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from chat.llm import get_provider
from chat.llm.base import ContextLengthExceeded, EmptyStream, StreamEvent
from chat.llm.openai_compat import OpenAICompatProvider
from tests.fixtures_real_llm import RealLLM
from tests.llm.conftest import stream

pytestmark = pytest.mark.real_llm

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a lighthouse."}]
# About 1,530 tokens with the chat template: well past n_ctx 1024.
TOO_LONG = [{"role": "user", "content": "word " * 1500}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def real_provider(real_llm: RealLLM) -> OpenAICompatProvider:
    built = get_provider()
    assert isinstance(built, OpenAICompatProvider)
    return built


def _post(server: RealLLM, body: dict, **kwargs) -> httpx.Response:
    body = {"model": server.model, **body}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60, **kwargs)


# --- what works ---------------------------------------------------------------------------


def test_complete_reports_text_usage_and_finish_reason(real_provider, real_llm):
    result = real_provider.complete(messages=HELLO, max_tokens=32, temperature=0)
    assert result.text.strip()
    assert result.finish_reason in ("stop", "length")
    assert result.model == real_llm.model
    assert result.usage is not None
    assert result.usage.prompt_tokens and result.usage.prompt_tokens > 10  # template included
    assert result.usage.completion_tokens and 0 < result.usage.completion_tokens <= 32


def test_stream_yields_deltas_then_done_without_usage(real_provider, mode):
    events = stream(real_provider, mode, messages=HELLO)
    done = events[-1]
    assert done.kind == "done" and done.text.strip()
    assert "".join(e.text for e in events if e.kind == "delta") == done.text
    assert done.finish_reason in ("stop", "length")
    # The provider asked for usage (stream_options.include_usage); the server says nothing.
    assert done.usage is None


def test_stream_options_are_accepted_and_ignored(real_llm):
    body = {"messages": HELLO, "max_tokens": 8, "stream": True}
    url = f"{real_llm.base_url}/chat/completions"
    with httpx.stream(
        "POST",
        url,
        json={"model": real_llm.model, **body, "stream_options": {"include_usage": True}},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        data = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert not any('"usage"' in line for line in data)


def test_tools_are_accepted_and_not_called(real_provider):
    # The model's own chat template knows no tools: the server takes them and ignores them.
    result = real_provider.complete(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=24,
        temperature=0,
    )
    assert result.tool_calls == []
    assert result.text.strip()


def test_models_do_not_report_the_context_window(real_llm):
    models = httpx.get(f"{real_llm.base_url}/models", timeout=10).json()
    assert models["data"] == [
        {"id": real_llm.model, "object": "model", "owned_by": "me", "permissions": []}
    ]
    # What the server does offer: a token count, without the chat template's tokens.
    count = httpx.post(
        f"{real_llm.url}/extras/tokenize/count",
        json={"input": " ".join(["word"] * 100)},
        timeout=10,
    )
    assert count.json() == {"count": 100}


def test_runes_per_token_differ_by_language(real_provider):
    """What the budget must learn per model (issue 13): one rune is much more than a token in
    English and about one in Chinese, measured by the server's own usage.prompt_tokens."""
    english = "The lighthouse keeper counted the ships that passed every evening. " * 6
    chinese = "灯塔看守人每天晚上都会数一数经过的船只。" * 6
    base = real_provider.complete(messages=[{"role": "user", "content": ""}], max_tokens=1)
    assert base.usage is not None and base.usage.prompt_tokens is not None
    ratios = {}
    for name, text in (("english", english), ("chinese", chinese)):
        result = real_provider.complete(messages=[{"role": "user", "content": text}], max_tokens=1)
        assert result.usage is not None and result.usage.prompt_tokens is not None
        ratios[name] = len(text) / (result.usage.prompt_tokens - base.usage.prompt_tokens)
    assert ratios["english"] > 3.5
    assert ratios["chinese"] < 1.5


# --- how it fails -------------------------------------------------------------------------


def test_overflow_not_streaming_is_a_400_with_openais_wording(real_provider, real_llm):
    raw = _post(real_llm, {"messages": TOO_LONG})
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(
        f"This model's maximum context length is {real_llm.n_ctx} tokens. However, you requested "
    )
    assert error["message"].endswith(
        "in the messages, None in the completion). Please reduce the length of the messages "
        "or completion."
    )
    with pytest.raises(ContextLengthExceeded) as info:
        real_provider.complete(messages=TOO_LONG)
    assert info.value.status == 400 and not info.value.retryable


def test_overflow_streaming_is_a_200_with_an_empty_stream(real_provider, real_llm, mode):
    body = {"model": real_llm.model, "messages": TOO_LONG, "stream": True}
    url = f"{real_llm.base_url}/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        # No event, no error object, no [DONE]: the body just ends (the server logs a
        # ValueError "Requested tokens (N) exceed context window of 1024" to itself).
        assert response.read() == b""
    started = time.monotonic()
    with pytest.raises(EmptyStream):
        stream(real_provider, mode, messages=TOO_LONG)
    # Three attempts (max_retries 2), each refused before the model runs.
    assert time.monotonic() - started < 10


def test_completions_are_served_one_at_a_time(real_provider):
    def one() -> float:
        started = time.monotonic()
        real_provider.complete(messages=STORY, max_tokens=48, temperature=0)
        return time.monotonic() - started

    one()  # the prompt in the server's cache: every call below is generation only
    solo = one()
    barrier = threading.Barrier(2)
    took: list[float] = []

    def racing() -> None:
        barrier.wait()
        took.append(one())

    threads = [threading.Thread(target=racing) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # The later one waited for the whole earlier one (served together, they would end
    # together). Half a solo run of margin: the machine's load varies between the calls.
    assert max(took) - min(took) >= 0.5 * solo, (solo, took)


def test_a_new_request_ends_a_running_stream_without_a_finish_reason(real_provider):
    """--interrupt_requests defaults to true: when a request waits, the running stream gets
    `data: [DONE]` after its next chunk, with no finish_reason. The provider cannot tell that
    from a whole reply except by the missing finish_reason."""
    events: list[StreamEvent] = []
    first_delta = threading.Event()

    async def read() -> None:
        async for event in real_provider.astream_chat(messages=STORY):
            events.append(event)
            first_delta.set()

    def long_stream() -> None:
        asyncio.run(read())

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert first_delta.wait(timeout=60)
    other = real_provider.complete(messages=HELLO, max_tokens=16, temperature=0)
    thread.join(timeout=60)
    assert other.text.strip()
    done = events[-1]
    assert done.kind == "done"
    assert done.finish_reason is None
    assert done.text.strip()  # what came before the interruption, as if it were the reply
    assert done.usage is None
