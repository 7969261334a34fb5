"""OpenAICompatProvider against the real fake server over loopback (no httpx mocking): the
happy paths (text, usage, tool calls, the summary model), the retry without stream options or
tools a server refuses, and how the provider is chosen. Retries, timeouts, errors and the
stream's wire format are in the test_openai_compat_*.py next to this."""

from __future__ import annotations

import json

import pytest

from chat.llm import get_provider, provider_info
from chat.llm.base import (
    SUMMARY_MARKER,
    LLMError,
)
from chat.llm.codec import _Codec
from tests.llm.conftest import USER_HI, stream

SUMMARY_PROMPT = [
    {"role": "system", "content": f"{SUMMARY_MARKER} Summarise the conversation."},
    {"role": "user", "content": "user: deploy to /srv/app on port 8443"},
]


def test_complete_returns_text_usage_and_model(provider, fake_llm):
    fake_llm.script("Hello there, general.")
    result = provider.complete(messages=USER_HI, max_tokens=50, temperature=0.2)
    assert result.text == "Hello there, general."
    assert result.finish_reason == "stop"
    assert result.model == "fake-chat"
    assert result.usage is not None and result.usage.completion_tokens == 3
    body = fake_llm.calls[-1].body
    assert body["model"] == "fake-chat"
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2
    assert "stream" not in body


ODD_MESSAGES = [{"role": "user", "content": 'naïve café 你好 \u2028 "quoted"'}]
BIG_INT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"max": 2**70}}}]


def _assert_sent_as_is(fake_llm) -> None:
    call = fake_llm.calls[-1]
    assert call.headers["content-type"] == "application/json"
    assert call.body["messages"] == ODD_MESSAGES
    assert call.body["tools"][0]["function"]["parameters"]["max"] == 2**70


def test_the_body_is_json_as_sent_whatever_it_holds(provider, fake_llm):
    """Encoded by orjson (codec.request_content), with the stdlib for what orjson refuses: a
    tool's arguments may hold an integer past 64 bits."""
    provider.complete(messages=ODD_MESSAGES, tools=BIG_INT_TOOLS)
    _assert_sent_as_is(fake_llm)


def test_the_streamed_body_is_json_as_sent_whatever_it_holds(provider, fake_llm, mode):
    stream(provider, mode, messages=ODD_MESSAGES, tools=BIG_INT_TOOLS)
    _assert_sent_as_is(fake_llm)


def test_auth_header_is_sent(provider, fake_llm):
    provider.complete(messages=USER_HI)
    assert fake_llm.calls[-1].headers["authorization"] == "Bearer test-key"


def test_no_auth_header_without_key(fake_llm, settings):
    settings.LLM_API_KEY = ""
    get_provider().complete(messages=USER_HI)
    assert "authorization" not in fake_llm.calls[-1].headers


def test_wrong_key_is_a_non_retryable_error_with_the_provider_message(provider, fake_llm):
    fake_llm.configure(require_api_key="other-key")
    with pytest.raises(LLMError) as info:
        provider.complete(messages=USER_HI)
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
    assert fake_llm.calls[-1].headers["authorization"] == "Bearer test-key"


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


def test_complete_returns_tool_calls(provider, fake_llm):
    fake_llm.script({"tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}]})
    result = provider.complete(messages=USER_HI)
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


def test_tools_rejection_is_retried_without_them_and_remembered(provider, fake_llm):
    fake_llm.configure(reject_tools=True)
    result = provider.complete(messages=USER_HI, tools=TOOLS)
    assert result.text == "Echo: one two three four five six"
    first, second = fake_llm.calls
    assert first.body.get("tools") and "tools" not in second.body
    provider.complete(messages=USER_HI, tools=TOOLS)
    assert fake_llm.count() == 3  # no second refusal


def test_tools_rejection_when_streaming_is_retried_without_them(provider, fake_llm, mode):
    fake_llm.configure(reject_tools=True)
    events = stream(provider, mode, messages=USER_HI, tools=TOOLS)
    assert events[-1].text == "Echo: one two three four five six"
    first, second = fake_llm.calls
    assert first.body.get("tools") and "tools" not in second.body
    stream(provider, mode, messages=USER_HI, tools=TOOLS)
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
