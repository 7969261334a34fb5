"""OpenAICompatProvider against the real fake server over loopback (no httpx mocking)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from chat.llm import get_provider, provider_info
from chat.llm.base import (
    SUMMARY_MARKER,
    ContextLengthExceeded,
    EmptyStream,
    LLMError,
    StreamInterrupted,
)
from chat.llm.codec import _Codec
from chat.llm.openai_compat import OpenAICompatProvider, classify_error
from devtools.fakellm import FakeLLMServer
from tests.llm.conftest import USER_HI, complete, stream

SUMMARY_PROMPT = [
    {"role": "system", "content": f"{SUMMARY_MARKER} Summarise the conversation."},
    {"role": "user", "content": "user: deploy to /srv/app on port 8443"},
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- happy paths --------------------------------------------------------------------------


def test_complete_returns_text_usage_and_model(provider, fake_llm, mode):
    fake_llm.script("Hello there, general.")
    result = complete(provider, mode, messages=USER_HI, max_tokens=50, temperature=0.2)
    assert result.text == "Hello there, general."
    assert result.finish_reason == "stop"
    assert result.model == "fake-chat"
    assert result.usage is not None and result.usage.completion_tokens == 3
    body = fake_llm.calls[-1].body
    assert body["model"] == "fake-chat"
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2
    assert "stream" not in body


@pytest.mark.parametrize("how", ["complete", "stream"])
def test_the_body_is_json_as_sent_whatever_it_holds(provider, fake_llm, mode, how):
    """Encoded by orjson (codec.request_content), with the stdlib for what orjson refuses: a
    tool's arguments may hold an integer past 64 bits."""
    messages = [{"role": "user", "content": 'naïve café 你好 \u2028 "quoted"'}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"max": 2**70}}}]
    if how == "complete":
        complete(provider, mode, messages=messages, tools=tools)
    else:
        stream(provider, mode, messages=messages, tools=tools)
    call = fake_llm.calls[-1]
    assert call.headers["content-type"] == "application/json"
    assert call.body["messages"] == messages
    assert call.body["tools"][0]["function"]["parameters"]["max"] == 2**70


def test_auth_header_is_sent(provider, fake_llm, mode):
    complete(provider, mode, messages=USER_HI)
    assert fake_llm.calls[-1].headers["authorization"] == "Bearer test-key"


def test_no_auth_header_without_key(fake_llm, settings):
    settings.LLM_API_KEY = ""
    get_provider().complete(messages=USER_HI)
    assert "authorization" not in fake_llm.calls[-1].headers


def test_wrong_key_is_a_non_retryable_error_with_the_provider_message(provider, fake_llm, mode):
    fake_llm.configure(require_api_key="other-key")
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert info.value.status == 401
    assert not info.value.retryable
    assert "Incorrect API key provided" in str(info.value)
    assert fake_llm.count() == 1


def test_summary_marker_selects_the_summary_model(provider, fake_llm):
    provider.complete(messages=SUMMARY_PROMPT)
    provider.complete(messages=SUMMARY_PROMPT, model="explicit")
    first, second = fake_llm.calls
    assert (first.kind, first.body["model"]) == ("summary", "fake-summary")
    assert second.body["model"] == "explicit"


def test_stream_yields_deltas_then_done_with_full_text_and_usage(provider, fake_llm, mode):
    fake_llm.script("The quick brown fox jumps.")
    events = stream(provider, mode, messages=USER_HI)
    deltas = [e for e in events if e.kind == "delta"]
    done = events[-1]
    assert len(deltas) == 5
    assert done.kind == "done" and [e.kind for e in events[:-1]] == ["delta"] * 5
    assert "".join(d.text for d in deltas) == done.text == "The quick brown fox jumps."
    assert done.finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens == 5
    body = fake_llm.calls[-1].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_stream_assembles_tool_calls_from_fragments(provider, fake_llm, mode):
    fake_llm.script(
        {
            "content": "Let me look.",
            "tool_calls": [
                {"id": "call_a", "name": "web_search", "arguments": {"q": "weather in Paris"}},
                {"name": "memory_write", "arguments": '{"content": "likes tea, 2 sugars"}'},
            ],
        }
    )
    tools = [{"type": "function", "function": {"name": "web_search", "parameters": {}}}]
    events = stream(provider, mode, messages=USER_HI, tools=tools)
    done = events[-1]
    assert done.text == "Let me look."
    assert done.finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in done.tool_calls] == [
        ("call_a", "web_search"),
        (done.tool_calls[1].id, "memory_write"),
    ]
    assert done.tool_calls[1].id  # the server's id, not empty
    assert json.loads(done.tool_calls[0].arguments) == {"q": "weather in Paris"}
    assert json.loads(done.tool_calls[1].arguments) == {"content": "likes tea, 2 sugars"}
    assert fake_llm.calls[-1].body["tools"] == tools


def test_complete_returns_tool_calls(provider, fake_llm, mode):
    fake_llm.script({"tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}]})
    result = complete(provider, mode, messages=USER_HI)
    assert result.text == ""
    assert result.finish_reason == "tool_calls"
    assert [c.as_openai() for c in result.tool_calls] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    ]


def test_stream_options_rejection_is_retried_without_them(provider, fake_llm, mode):
    fake_llm.configure(reject_stream_options=True)
    events = stream(provider, mode, messages=USER_HI)
    assert events[-1].text == "Echo: one two three four five six"
    first, second = fake_llm.calls
    assert "stream_options" in first.body and "stream_options" not in second.body
    # Remembered: later streams do not pay for the rejected attempt again.
    stream(provider, mode, messages=USER_HI)
    assert fake_llm.count() == 3


TOOLS = [
    {
        "type": "function",
        "function": {"name": "clock", "description": "time", "parameters": {"type": "object"}},
    }
]


@pytest.mark.parametrize("how", ["stream", "complete"])
def test_tools_rejection_is_retried_without_them_and_remembered(provider, fake_llm, mode, how):
    fake_llm.configure(reject_tools=True)
    call = stream if how == "stream" else complete
    result = call(provider, mode, messages=USER_HI, tools=TOOLS)
    text = result[-1].text if how == "stream" else result.text
    assert text == "Echo: one two three four five six"
    first, second = fake_llm.calls
    assert first.body.get("tools") and "tools" not in second.body
    call(provider, mode, messages=USER_HI, tools=TOOLS)
    assert fake_llm.count() == 3  # no second refusal


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("llama3 does not support tools", True),
        ("tools is not supported by this model", True),
        ("Unrecognized request argument supplied: tools", True),
        ('"auto" tool choice requires --enable-auto-tool-choice; tool_choice not allowed', True),
        ("messages must be a non-empty list", False),
        ("This model's maximum context length is 1024 tokens", False),
    ],
)
def test_which_refusals_are_about_tools(message, refused):
    assert _Codec.rejects_tools(LLMError(message, status=400)) is refused
    assert _Codec.rejects_tools(LLMError(message, status=500)) is False


# --- retries ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503, 429])
def test_retries_transient_errors_then_succeeds(provider, fake_llm, mode, status):
    fake_llm.fail_next(str(status), times=2)
    assert complete(provider, mode, messages=USER_HI).text.startswith("Echo:")
    assert fake_llm.count() == 3


@pytest.mark.parametrize("status", [500, 429])
def test_stream_retries_before_the_first_token(provider, fake_llm, mode, status):
    fake_llm.fail_next(str(status), times=2)
    events = stream(provider, mode, messages=USER_HI)
    assert events[-1].text == "Echo: one two three four five six"
    assert fake_llm.count() == 3


def test_gives_up_after_max_retries(provider, fake_llm, mode):
    fake_llm.fail_next("503", times=5)
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert info.value.status == 503 and info.value.retryable
    assert fake_llm.count() == 3  # 1 + LLM_MAX_RETRIES


def test_honours_a_small_retry_after(provider, fake_llm, mode):
    fake_llm.fail_next("429", retry_after=0.3)
    started = time.monotonic()
    complete(provider, mode, messages=USER_HI)
    assert time.monotonic() - started >= 0.3
    assert fake_llm.count() == 2


def test_a_long_retry_after_fails_fast(provider, fake_llm, mode):
    fake_llm.fail_next("429", retry_after=600)
    started = time.monotonic()
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert info.value.retry_after == 600
    assert time.monotonic() - started < 5
    assert fake_llm.count() == 1


def test_connect_refused_is_retried_until_the_server_appears(mode):
    port = _free_port()
    provider = OpenAICompatProvider(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="fake-chat",
        max_retries=5,
        backoff_base_seconds=0.1,
        connect_timeout_seconds=1,
        timeout_seconds=2,
    )
    late = FakeLLMServer(port=port)
    # The first attempt is refused; the server is up before the backoff runs out.
    timer = threading.Timer(0.15, late.start)
    timer.start()
    try:
        assert complete(provider, mode, messages=USER_HI).text.startswith("Echo:")
        assert late.count() == 1
    finally:
        timer.join()
        late.stop()


def test_connect_refused_exhausts_retries(mode):
    provider = OpenAICompatProvider(
        base_url=f"http://127.0.0.1:{_free_port()}/v1",
        model="m",
        max_retries=2,
        backoff_base_seconds=0.01,
    )
    with pytest.raises(LLMError) as info:
        stream(provider, mode, messages=USER_HI)
    assert info.value.retryable and "ConnectError" in str(info.value)


# --- interruption and timeouts ------------------------------------------------------------


def test_cut_after_first_tokens_raises_stream_interrupted_without_retry(provider, fake_llm, mode):
    fake_llm.fail_next("cut", after_tokens=3)
    seen = []
    with pytest.raises(StreamInterrupted) as info:
        stream(provider, mode, messages=USER_HI, seen=seen)
    assert info.value.partial == "Echo: one two "
    assert "".join(e.text for e in seen) == info.value.partial
    assert not info.value.retryable
    assert fake_llm.count() == 1


def test_cut_before_any_token_is_retried(provider, fake_llm, mode):
    fake_llm.fail_next("cut", after_tokens=0)
    events = stream(provider, mode, messages=USER_HI)
    assert events[-1].text == "Echo: one two three four five six"
    assert fake_llm.count() == 2


def test_hang_mid_stream_times_out_as_stream_interrupted(provider, fake_llm, mode):
    fake_llm.fail_next("hang", after_tokens=2, seconds=10)
    started = time.monotonic()
    with pytest.raises(StreamInterrupted) as info:
        stream(provider, mode, messages=USER_HI)
    assert info.value.partial == "Echo: one "
    assert "timed out" in str(info.value)
    assert time.monotonic() - started < 5
    assert fake_llm.count() == 1


def test_a_stream_without_one_event_is_an_empty_stream(provider, fake_llm, mode):
    # llama-cpp-python's answer to a streamed prompt over its window (docs/real-llm-notes.md).
    fake_llm.configure(context_window=10)
    with pytest.raises(EmptyStream) as info:
        stream(provider, mode, messages=[{"role": "user", "content": "word " * 20}])
    assert info.value.retryable and fake_llm.count() == 3
    # A stream that said anything at all and then ended early is not.
    fake_llm.configure(context_window=0)
    fake_llm.fail_next("cut", after_tokens=0, times=3)
    with pytest.raises(LLMError) as cut:
        stream(provider, mode, messages=USER_HI)
    assert not isinstance(cut.value, EmptyStream)


def test_timeout_before_the_first_token_is_retried(provider, fake_llm, mode):
    fake_llm.fail_next("hang", seconds=10)
    events = stream(provider, mode, messages=USER_HI)
    assert events[-1].text.startswith("Echo:")
    assert fake_llm.count() == 2


def test_persistent_timeout_raises_a_retryable_error(fake_llm, mode):
    provider = OpenAICompatProvider(
        base_url=fake_llm.base_url,
        model="fake-chat",
        timeout_seconds=0.3,
        max_retries=1,
        backoff_base_seconds=0.01,
    )
    fake_llm.fail_next("hang", times=2, seconds=10)
    started = time.monotonic()
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert info.value.retryable and "timed out" in str(info.value)
    assert 0.6 <= time.monotonic() - started < 5
    assert fake_llm.count() == 2


# --- errors that are not worth a retry ----------------------------------------------------


def test_context_length_exceeded(provider, fake_llm, mode):
    fake_llm.fail_next("context_length")
    with pytest.raises(ContextLengthExceeded) as info:
        complete(provider, mode, messages=USER_HI)
    assert info.value.status == 400 and not info.value.retryable
    assert "maximum context length" in str(info.value)
    assert fake_llm.count() == 1


def test_context_length_exceeded_when_streaming(provider, fake_llm, mode):
    fake_llm.fail_next("context_length")
    with pytest.raises(ContextLengthExceeded):
        stream(provider, mode, messages=USER_HI)
    assert fake_llm.count() == 1


@pytest.mark.parametrize(
    "message",
    [
        # vLLM / DeepSeek
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens",
        # llama.cpp
        "the request exceeds the available context size, try increasing the context size",
        # Ollama
        "input length exceeds maximum context length",
        # Qwen / DashScope
        "Range of input length should be [1, 30720]",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "Too many tokens in the prompt",
    ],
)
def test_context_length_wordings_from_other_servers(provider, fake_llm, message):
    fake_llm.fail_next("http_error", status=400, message=message)
    with pytest.raises(ContextLengthExceeded):
        provider.complete(messages=USER_HI)
    assert fake_llm.count() == 1


def test_classify_error_shapes():
    llama = {"error": {"code": 400, "message": "x", "type": "exceed_context_size_error"}}
    assert isinstance(classify_error(status=400, payload=llama), ContextLengthExceeded)
    vllm = {"object": "error", "message": "maximum context length is 2048", "code": 400}
    assert isinstance(classify_error(status=400, payload=vllm), ContextLengthExceeded)
    assert isinstance(classify_error(status=413, payload="too big"), ContextLengthExceeded)
    # A tokens-per-minute rate limit is not an oversized prompt.
    tpm = {"error": {"message": "Rate limit: too many tokens per minute", "code": "rate_limit"}}
    limited = classify_error(status=429, payload=tpm)
    assert type(limited) is LLMError and limited.retryable
    plain = classify_error(status=404, payload={"error": {"message": "model not found"}})
    assert type(plain) is LLMError and not plain.retryable
    assert "model not found" in str(plain)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_other_client_errors_are_not_retried(provider, fake_llm, mode, status):
    fake_llm.fail_next("http_error", status=status, message="The model `nope` does not exist")
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert type(info.value) is LLMError
    assert info.value.status == status and not info.value.retryable
    assert "The model `nope` does not exist" in str(info.value)
    assert fake_llm.count() == 1


def test_invalid_json_body_is_an_llm_error(provider, fake_llm, mode):
    fake_llm.fail_next("invalid_json")
    with pytest.raises(LLMError) as info:
        complete(provider, mode, messages=USER_HI)
    assert "invalid JSON" in str(info.value)
    assert fake_llm.count() == 1


def test_invalid_json_stream_is_an_llm_error(provider, fake_llm, mode):
    fake_llm.fail_next("invalid_json")
    with pytest.raises(LLMError) as info:
        stream(provider, mode, messages=USER_HI)
    assert "invalid JSON" in str(info.value)


def test_cut_non_streaming_body_is_retried(provider, fake_llm, mode):
    fake_llm.fail_next("cut")
    assert complete(provider, mode, messages=USER_HI).text.startswith("Echo:")
    assert fake_llm.count() == 2


# --- genuinely async callers (one event loop, like a consumer) -----------------------------


async def test_async_stream_in_the_test_loop(provider, fake_llm):
    fake_llm.script("alpha beta", "gamma")
    texts = []
    for _ in range(2):
        events = [e async for e in provider.astream_chat(messages=USER_HI)]
        texts.append(events[-1].text)
    assert texts == ["alpha beta", "gamma"]
    await provider.aclose()


async def test_async_interruption_keeps_partial(provider, fake_llm):
    fake_llm.fail_next("cut", after_tokens=1)
    got = []
    with pytest.raises(StreamInterrupted) as info:
        async for event in provider.astream_chat(messages=USER_HI):
            got.append(event.text)
    assert info.value.partial == "Echo: " == "".join(got)


# --- provider selection -------------------------------------------------------------------


def test_provider_info_shows_host_not_key(fake_llm, settings):
    settings.LLM_API_KEY = "sk-secret"
    info = provider_info()
    assert info == {
        "name": "openai",
        "model": "fake-chat",
        "summary_model": "fake-summary",
        "offline": False,
        "base_url": f"127.0.0.1:{fake_llm.port}",
    }
    assert "sk-secret" not in json.dumps(info)


def test_provider_is_cached_and_rebuilt_when_settings_change(fake_llm, settings):
    first = get_provider()
    assert get_provider() is first
    settings.LLM_MODEL = "other"
    second = get_provider()
    assert second is not first and second.model == "other"


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"data: a\n\n"], ["data: a", ""]),
        ([b"data: a\r\n\r\n"], ["data: a", ""]),
        ([b"data: a\r", b"\ndata: b\r", b"\r"], ["data: a", "data: b", ""]),
        ([b"da", b"ta: a", b"\n"], ["data: a"]),
        # A multi-byte character split across chunks decodes whole.
        (["data: é\n".encode()[:7], "data: é\n".encode()[7:]], ["data: é"]),
        ([b"data: a\n", b"data: tail"], ["data: a", "data: tail"]),
    ],
)
def test_sse_lines_split_on_every_line_ending(chunks, lines):
    from chat.llm.openai_compat import _SSELines

    splitter = _SSELines()
    got = [line for chunk in chunks for line in splitter.feed(chunk)] + splitter.close()
    assert got == lines


def test_a_stream_compressed_against_our_accept_encoding_is_still_read(mode):
    """Streams ask for `identity` and read raw bytes; a server (or proxy) that gzips anyway
    is decoded, not parsed as garbage."""
    import gzip
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    chunks = [
        {"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("al", "pha ", "beta")
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    asked: list[str | None] = []

    class Gzipping(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.append(self.headers.get("Accept-Encoding"))
            payload = gzip.compress(body.encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gzipping)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = OpenAICompatProvider(
            base_url=f"http://127.0.0.1:{server.server_port}/v1", model="m", max_retries=0
        )
        events = stream(provider, mode, messages=USER_HI)
    finally:
        server.shutdown()
        server.server_close()
    assert "".join(e.text for e in events if e.kind == "delta") == "alpha beta"
    assert events[-1].kind == "done"
    assert asked[0] == "identity"
