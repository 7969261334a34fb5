"""OpenAICompatProvider against the real fake server: the errors not worth a retry (the
context length in its wordings, other client errors, invalid JSON) and how errors classify."""

from __future__ import annotations

import pytest

from chat.llm.base import (
    ContextLengthExceeded,
    LLMError,
)
from chat.llm.openai_compat import classify_error
from tests.llm.conftest import USER_HI, stream


def test_context_length_exceeded(provider, fake_llm):
    fake_llm.fail_next("context_length")
    with pytest.raises(ContextLengthExceeded) as info:
        provider.complete(messages=USER_HI)
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
def test_other_client_errors_are_not_retried(provider, fake_llm, status):
    fake_llm.fail_next("http_error", status=status, message="The model `nope` does not exist")
    with pytest.raises(LLMError) as info:
        provider.complete(messages=USER_HI)
    assert type(info.value) is LLMError
    assert info.value.status == status and not info.value.retryable
    assert "The model `nope` does not exist" in str(info.value)
    assert fake_llm.count() == 1


def test_invalid_json_body_is_an_llm_error(provider, fake_llm):
    fake_llm.fail_next("invalid_json")
    with pytest.raises(LLMError) as info:
        provider.complete(messages=USER_HI)
    assert "invalid JSON" in str(info.value)
    assert fake_llm.count() == 1


def test_invalid_json_stream_is_an_llm_error(provider, fake_llm, mode):
    fake_llm.fail_next("invalid_json")
    with pytest.raises(LLMError) as info:
        stream(provider, mode, messages=USER_HI)
    assert "invalid JSON" in str(info.value)


def test_cut_non_streaming_body_is_retried(provider, fake_llm):
    fake_llm.fail_next("cut")
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")
    assert fake_llm.count() == 2
