"""The fake OpenAI-compatible server itself: pacing, counting, control API, concurrency."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chat.llm.base import SUMMARY_MARKER, StreamInterrupted
from chat.llm.fake_server import GARBAGE_TEXT, FakeLLMServer, tokenize
from tests.llm.conftest import USER_HI

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
    events = list(provider.stream_chat(messages=USER_HI))
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
    list(provider.stream_chat(messages=USER_HI))
    assert (fake_llm.count(), fake_llm.count("chat"), fake_llm.count("summary")) == (3, 2, 1)
    kinds = [(c.index, c.kind, c.stream) for c in fake_llm.calls]
    assert kinds == [(1, "chat", False), (2, "summary", False), (3, "chat", True)]
    assert fake_llm.calls[1].body["messages"] == SUMMARY
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
        list(provider.stream_chat(messages=USER_HI))
    assert info.value.partial == "alpha beta "
    assert provider.complete(messages=USER_HI).text == "next"
