"""The fake OpenAI-compatible server itself: pacing, counting, control API, concurrency."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from chat.llm.base import (
    SUMMARY_MARKER,
    ContextLengthExceeded,
    EmptyStream,
    LLMError,
    StreamInterrupted,
)
from devtools.fakellm import GARBAGE_TEXT, FakeLLMServer, tokenize
from tests.llm.conftest import USER_HI, stream

SUMMARY = [
    {"role": "system", "content": f"{SUMMARY_MARKER} Compress."},
    {"role": "user", "content": "user: the server runs on port 8080.\nassistant: noted."},
]


def _raw_chunks(server: FakeLLMServer, body: dict) -> list[dict]:
    """The decoded `data:` payloads of one streamed response, read with a bare httpx client."""
    chunks = []
    url = f"{server.base_url}/chat/completions"
    with httpx.Client(timeout=5) as client, client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
            elif line == "data: [DONE]":
                chunks.append({"done": True})
    return chunks


def test_tokenize_round_trips_and_splits_cjk():
    text = "Hello,  world!\n你好世界 ok"
    assert "".join(tokenize(text)) == text
    assert tokenize("你好") == ["你", "好"]


def test_token_rate_is_roughly_respected(fake_llm, provider):
    fake_llm.configure(token_ms=20)
    fake_llm.script("a b c d e f g h i j k")  # 11 tokens → 10 gaps of 20 ms
    started = time.monotonic()
    events = stream(provider, "async", messages=USER_HI)
    elapsed = time.monotonic() - started
    assert events[-1].text == "a b c d e f g h i j k"
    assert elapsed >= 0.8 * 10 * 0.020  # loose lower bound only: CI machines are slow, not fast


def test_per_reply_token_rate_and_emit_timestamps(fake_llm):
    fake_llm.script({"content": "one two three four", "token_ms": 30})
    chunks = _raw_chunks(
        fake_llm, {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert chunks[-1] == {"done": True}
    content = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
    stamps = [c["x_emit_ts"] for c in content]
    assert len(stamps) == 4
    assert stamps[-1] - stamps[0] >= 0.8 * 3 * 0.030
    assert all(isinstance(c["created"], int) for c in chunks[:-1])
    assert chunks[-2]["usage"]["completion_tokens"] == 4 and chunks[-2]["choices"] == []


def test_tool_calls_are_streamed_in_openai_delta_format(fake_llm):
    fake_llm.script(
        {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"city": "Lyon"}}]}
    )
    chunks = _raw_chunks(fake_llm, {"messages": USER_HI, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": ""},
    }
    assert len(calls) > 2  # arguments arrive in several fragments
    assert all(set(c) == {"index", "function"} for c in calls[1:])
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Lyon"}
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finish[-1] == "tool_calls"


def test_calls_are_counted_by_kind_with_their_bodies(fake_llm, provider):
    provider.complete(messages=USER_HI)
    provider.complete(messages=SUMMARY)
    stream(provider, "async", messages=USER_HI)
    assert (fake_llm.count(), fake_llm.count("chat"), fake_llm.count("summary")) == (3, 2, 1)
    kinds = [(c.index, c.kind, c.stream) for c in fake_llm.calls]
    assert kinds == [(1, "chat", False), (2, "summary", False), (3, "chat", True)]
    assert fake_llm.calls[1].body["messages"] == SUMMARY
    # Kept as received, out of the garbage collector's sight (a benchmark makes thousands).
    assert isinstance(fake_llm.calls[1].raw_body, bytes)
    assert fake_llm.calls_json()["calls"][1]["body"]["messages"] == SUMMARY
    fake_llm.reset()
    assert fake_llm.call_count == 0


def test_scripts_are_per_kind_and_defaults_follow(fake_llm, provider):
    fake_llm.script("chat one")
    fake_llm.script_summary("summary one")
    assert provider.complete(messages=SUMMARY).text == "summary one"
    assert provider.complete(messages=USER_HI).text == "chat one"
    assert provider.complete(messages=USER_HI).text == "Echo: one two three four five six"
    digest = provider.complete(messages=SUMMARY).text
    assert "8080" in digest and digest == provider.complete(messages=SUMMARY).text
    assert len(provider.complete(messages=SUMMARY, max_tokens=5).text) <= 20


def test_summary_faults_empty_and_garbage(fake_llm, provider):
    fake_llm.fail_next("empty", target="summary")
    fake_llm.fail_next("garbage", target="summary")
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")  # chat: untouched
    assert provider.complete(messages=SUMMARY).text == ""
    assert provider.complete(messages=SUMMARY).text == GARBAGE_TEXT
    assert [c.fault for c in fake_llm.calls] == [None, "empty", "garbage"]


def test_fault_pinned_to_a_call_number_and_script_survives_faults(fake_llm, provider):
    fake_llm.fail_next("500", on_call=2)
    fake_llm.script("first", "second")
    assert provider.complete(messages=USER_HI).text == "first"
    # Call 2 fails, the retry (call 3) gets the script the failed call did not consume.
    assert provider.complete(messages=USER_HI).text == "second"
    assert [c.fault for c in fake_llm.calls] == [None, "http_error", None]


def test_unknown_fault_kind_is_rejected(fake_llm):
    with pytest.raises(ValueError, match="unknown fault kind"):
        fake_llm.fail_next("meteor")


def test_models_endpoint(fake_llm):
    data = httpx.get(f"{fake_llm.base_url}/models").json()
    assert {m["id"] for m in data["data"]} == {"fake-chat", "fake-summary"}


def test_http_control_api_from_a_separate_client(fake_llm, provider):
    control = httpx.Client(base_url=f"{fake_llm.url}/_control", timeout=5)
    assert control.post("/script", json={"replies": ["scripted over HTTP"]}).json() == {"ok": True}
    control.post("/script", json={"target": "summary", "reply": "short digest"})
    control.post("/fault", json={"kind": "503", "times": 1, "retry_after": 0})
    control.post(
        "/script",
        json={"replies": [{"tool_calls": [{"name": "memory_write", "arguments": {"k": "v"}}]}]},
    )
    assert provider.complete(messages=USER_HI).text == "scripted over HTTP"
    assert provider.complete(messages=SUMMARY).text == "short digest"
    tool_turn = provider.complete(messages=USER_HI)
    assert tool_turn.tool_calls[0].name == "memory_write"

    calls = control.get("/calls").json()
    assert (calls["total"], calls["chat"], calls["summary"]) == (4, 3, 1)
    assert calls["calls"][0]["fault"] == "http_error"
    assert calls["calls"][0]["body"]["messages"] == USER_HI

    assert control.post("/fault", json={"kind": "meteor"}).status_code == 400
    assert control.post("/config", json={"token_ms": 1, "reply_words": 8}).json()["ok"]
    assert len(provider.complete(messages=USER_HI).text.split()) == 8
    control.post("/reset")
    assert control.get("/calls").json()["total"] == 0
    control.close()


async def test_fifty_concurrent_streams_all_complete(fake_llm, provider):
    fake_llm.configure(token_ms=5, reply_words=20)

    async def one(i: int) -> str:
        messages = [{"role": "user", "content": f"request {i}"}]
        events = [e async for e in provider.astream_chat(messages=messages)]
        assert events[-1].kind == "done"
        return events[-1].text

    started = time.monotonic()
    texts = await asyncio.gather(*(one(i) for i in range(50)))
    elapsed = time.monotonic() - started
    assert all(t.startswith(f"Echo: request {i} ") for i, t in enumerate(texts))
    assert all(len(t.split()) == 20 for t in texts)
    assert fake_llm.count() == 50
    # Concurrent, not serial: 50 x 19 gaps x 5 ms would take ~4.75 s in series.
    assert elapsed < 4
    await provider.aclose()


def test_hanging_handlers_are_released_by_reset(fake_llm):
    fake_llm.fail_next("hang", seconds=30)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fake_llm.base_url}/chat/completions", json={"messages": USER_HI}, timeout=0.2)
    started = time.monotonic()
    fake_llm.reset()
    # The server still answers promptly after waking the hung handler.
    assert httpx.get(f"{fake_llm.url}/_control/health", timeout=2).json() == {"ok": True}
    assert time.monotonic() - started < 2


def test_fakellm_command_serves_in_another_process(tmp_path):
    with FakeLLMServer() as probe:  # borrow a free port
        port = probe.port
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "fakellm", "--port", str(port), "--token-ms", "1"],
        cwd=repo,
        env={**os.environ, "SECRET_KEY": os.environ.get("SECRET_KEY", "x" * 50)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/_control/health", timeout=0.5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"fakellm did not start: {out}")
                time.sleep(0.1)
        httpx.post(f"{url}/_control/script", json={"replies": ["from afar"]})
        reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER_HI}).json()
        assert reply["choices"][0]["message"]["content"] == "from afar"
        assert httpx.get(f"{url}/_control/calls").json()["total"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_default_summary_obeys_the_length_the_prompt_asks_for(fake_llm, provider):
    ask = [
        SUMMARY[0],
        {"role": "user", "content": SUMMARY[1]["content"] + "\nAt most 40 characters."},
    ]
    assert 0 < len(provider.complete(messages=ask).text) <= 40


def test_a_mid_stream_cut_consumes_the_script(fake_llm, provider):
    fake_llm.script("alpha beta gamma delta", "next")
    fake_llm.fail_next("cut", after_tokens=2)
    with pytest.raises(StreamInterrupted) as info:
        stream(provider, "async", messages=USER_HI)
    assert info.value.partial == "alpha beta "
    assert provider.complete(messages=USER_HI).text == "next"


# --- the failure shapes of real servers (docs/real-llm-notes.md) ---------------------------

LONG = [{"role": "user", "content": "word " * 400}]  # ~2,000 runes: 500 tokens by the estimate


def _post(server: FakeLLMServer, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5)


def test_models_report_the_context_window_in_vllm_and_llama_cpp_fields(fake_llm):
    models = httpx.get(f"{fake_llm.base_url}/models").json()["data"]
    assert all("max_model_len" not in m and "meta" not in m for m in models)  # as OpenAI
    fake_llm.configure(context_window=1024, train_context_window=8192)
    for model in httpx.get(f"{fake_llm.base_url}/models").json()["data"]:
        assert model["max_model_len"] == 1024
        assert model["meta"] == {"n_ctx": 1024, "n_ctx_train": 8192}


def test_a_prompt_over_the_window_ends_the_stream_before_its_first_event(fake_llm):
    fake_llm.configure(context_window=100)
    fake_llm.script("kept for the next call that fits")
    url = f"{fake_llm.base_url}/chat/completions"
    with httpx.stream("POST", url, json={"messages": LONG, "stream": True}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        assert resp.read() == b""
    whole = _post(fake_llm, {"messages": LONG})
    assert whole.status_code == 400
    assert whole.json()["error"]["code"] == "context_length_exceeded"
    assert whole.json()["error"]["message"].startswith(
        "This model's maximum context length is 100 tokens. However, you requested 500 tokens "
        "(500 in the messages, None in the completion)."
    )
    assert [c.fault for c in fake_llm.calls] == ["overflow_cut", "overflow_cut"]
    fits = _post(fake_llm, {"messages": USER_HI}).json()
    assert fits["choices"][0]["message"]["content"] == "kept for the next call that fits"


def test_what_the_provider_makes_of_an_overflow_cut(fake_llm, provider):
    fake_llm.configure(context_window=100)
    with pytest.raises(EmptyStream, match="ended before the reply was complete"):
        stream(provider, "async", messages=LONG)
    # Retried like any short stream (it can also be a restart), then given up.
    assert fake_llm.count() == 3
    with pytest.raises(ContextLengthExceeded):
        provider.complete(messages=LONG)


@pytest.mark.parametrize(
    ("overflow", "wording"),
    [("context_length", "maximum context length"), ("stream_error", "context size")],
)
def test_the_overflow_shape_is_configurable(fake_llm, provider, overflow, wording):
    fake_llm.configure(context_window=100, context_overflow=overflow)
    with pytest.raises(ContextLengthExceeded, match=wording):
        stream(provider, "async", messages=LONG)
    assert fake_llm.count() == 1
    fake_llm.configure(context_overflow="")  # reported, not enforced
    assert provider.complete(messages=LONG).text.startswith("Echo: word")


def test_an_error_object_inside_the_stream(fake_llm, provider):
    fake_llm.fail_next("stream_error", message="CUDA out of memory")
    chunks = _raw_chunks(fake_llm, {"messages": USER_HI, "stream": True})
    assert chunks[1] == {
        "error": {
            "message": "CUDA out of memory",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
    }
    assert chunks[-1] == {"done": True}
    fake_llm.fail_next("stream_error", message="CUDA out of memory")
    with pytest.raises(LLMError, match="CUDA out of memory") as before:
        stream(provider, "async", messages=USER_HI)
    assert not isinstance(before.value, StreamInterrupted)
    fake_llm.fail_next("stream_error", after_tokens=2)
    with pytest.raises(StreamInterrupted, match="injected in-stream error") as after:
        stream(provider, "async", messages=USER_HI)
    assert after.value.partial == "Echo: one "


def test_an_error_object_as_a_whole_body(fake_llm, provider):
    fake_llm.fail_next("stream_error", message="the request exceeds the available context size")
    with pytest.raises(ContextLengthExceeded):
        provider.complete(messages=USER_HI)


def test_thinking_in_tags_is_content(fake_llm):
    fake_llm.fail_next("think_tags", message="hmm")
    fake_llm.script("The answer.")
    chunks = _raw_chunks(fake_llm, {"messages": USER_HI, "stream": True})
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert text == "<think>\nhmm\n</think>\n\nThe answer."


def test_reasoning_content_deltas_come_before_the_content(fake_llm, provider):
    fake_llm.script({"content": "Paris.", "reasoning": "The capital of France"})
    chunks = _raw_chunks(fake_llm, {"messages": USER_HI, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    thought = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
    assert "".join(thought) == "The capital of France"
    assert all(d["content"] is None for d in deltas if "reasoning_content" in d)
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."
    fake_llm.fail_next("reasoning")
    whole = _post(fake_llm, {"messages": USER_HI}).json()["choices"][0]["message"]
    assert whole["reasoning_content"].startswith("Okay")
    assert whole["content"].startswith("Echo:")
    # The provider keeps only the answer (what it should do with the reasoning: issue 13).
    fake_llm.fail_next("reasoning", target="chat", times=2)
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")
    assert stream(provider, "async", messages=USER_HI)[-1].text.startswith("Echo:")


@pytest.mark.parametrize("how", ["fault", "server"])
def test_no_usage_at_all(fake_llm, provider, how):
    if how == "fault":
        fake_llm.fail_next("no_usage", times=2)
    else:
        fake_llm.configure(usage=False)
    assert provider.complete(messages=USER_HI).usage is None
    done = stream(provider, "async", messages=USER_HI)[-1]
    assert done.usage is None and done.text.startswith("Echo:")
    assert "stream_options" in fake_llm.calls[-1].body  # asked for, not given


def test_finish_reason_length_cuts_the_reply(fake_llm, provider):
    fake_llm.fail_next("length", after_tokens=2)
    done = stream(provider, "async", messages=USER_HI)[-1]
    assert (done.text, done.finish_reason) == ("Echo: one ", "length")
    fake_llm.fail_next("length")
    cut = provider.complete(messages=USER_HI, max_tokens=3)
    assert (cut.text, cut.finish_reason) == ("Echo: one two ", "length")


def test_servers_that_reject_tools_or_stream_options(fake_llm, provider):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    fake_llm.configure(reject_tools=True)
    rejected = _post(fake_llm, {"messages": USER_HI, "model": "m1", "tools": tools})
    assert rejected.status_code == 400
    assert rejected.json()["error"]["message"] == "m1 does not support tools"
    # The provider retries without tools (tests/llm/test_openai_compat.py has the details).
    assert provider.complete(messages=USER_HI, tools=tools).text.startswith("Echo:")
    assert [bool(c.body.get("tools")) for c in fake_llm.calls[-2:]] == [True, False]
    fake_llm.configure(reject_stream_options=True)
    body = {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}}
    refused = _post(fake_llm, body)
    assert refused.status_code == 400 and "stream_options" in refused.text


def test_single_slot_serves_one_request_at_a_time(fake_llm):
    def three_at_once() -> list[float]:
        threads = [
            threading.Thread(
                target=_raw_chunks, args=(fake_llm, {"messages": USER_HI, "stream": True})
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        return sorted(c.started_at for c in fake_llm.calls[-3:])

    # A reply of 7 tokens takes 360 ms: wide enough that a loaded machine's thread start-up
    # (tens of ms) cannot make parallel calls look queued, nor queued ones parallel.
    fake_llm.configure(slots=1, token_ms=60)
    starts = three_at_once()
    assert starts[1] - starts[0] >= 0.3 and starts[2] - starts[1] >= 0.3
    fake_llm.configure(slots=0)
    starts = three_at_once()
    assert starts[2] - starts[0] < 0.3  # all three began before the first could have ended


def test_a_waiting_request_interrupts_the_running_stream(fake_llm, provider):
    """llama-cpp-python's default: the stream ends with [DONE] and no finish_reason, which the
    provider cannot tell from a complete reply but by that missing finish_reason."""
    fake_llm.fail_next("interrupted", after_tokens=2)
    done = stream(provider, "async", messages=USER_HI)[-1]
    assert (done.text, done.finish_reason) == ("Echo: one ", None)

    fake_llm.configure(slots=1, interrupt_requests=True, token_ms=50)
    first: list = []
    thread = threading.Thread(
        target=lambda: stream(provider, "async", seen=first, messages=USER_HI)
    )
    thread.start()
    deadline = time.monotonic() + 5
    while not fake_llm.calls or fake_llm.calls[-1].started_at is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.06)  # a token or two out
    assert provider.complete(messages=USER_HI).text == "Echo: one two three four five six"
    thread.join(timeout=10)
    assert first[-1].finish_reason is None
    assert 0 < len(first[-1].text) < len("Echo: one two three four five six")


def test_configuration_is_validated(fake_llm):
    with pytest.raises(ValueError, match="context_overflow"):
        fake_llm.configure(context_overflow="explode")
    with pytest.raises(TypeError, match="unknown settings"):
        fake_llm.configure(color="red")
    control = httpx.post(f"{fake_llm.url}/_control/config", json={"slots": -1})
    assert control.status_code == 400
    assert fake_llm.config.slots == 0
