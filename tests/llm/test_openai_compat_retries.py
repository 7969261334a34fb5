"""OpenAICompatProvider against the real fake server: what it retries (transient statuses,
Retry-After, refused connections, a cut before the first token, timeouts) and what interrupts
a stream for good."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from chat.llm.base import (
    EmptyStream,
    LLMError,
    StreamInterrupted,
)
from chat.llm.openai_compat import OpenAICompatProvider
from devtools.fakellm import FakeLLMServer
from tests.llm.conftest import USER_HI, stream


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("status", [500, 503, 429])
def test_retries_transient_errors_then_succeeds(provider, fake_llm, status):
    fake_llm.fail_next(str(status), times=2)
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")
    assert fake_llm.count() == 3


@pytest.mark.parametrize("status", [500, 429])
def test_stream_retries_before_the_first_token(provider, fake_llm, mode, status):
    fake_llm.fail_next(str(status), times=2)
    events = stream(provider, mode, messages=USER_HI)
    assert events[-1].text == "Echo: one two three four five six"
    assert fake_llm.count() == 3


def test_gives_up_after_max_retries(provider, fake_llm):
    fake_llm.fail_next("503", times=5)
    with pytest.raises(LLMError) as info:
        provider.complete(messages=USER_HI)
    assert info.value.status == 503 and info.value.retryable
    assert fake_llm.count() == 3  # 1 + LLM_MAX_RETRIES


def test_honours_a_small_retry_after(provider, fake_llm):
    fake_llm.fail_next("429", retry_after=0.3)
    started = time.monotonic()
    provider.complete(messages=USER_HI)
    assert time.monotonic() - started >= 0.3
    assert fake_llm.count() == 2


def test_a_long_retry_after_fails_fast(provider, fake_llm):
    fake_llm.fail_next("429", retry_after=600)
    started = time.monotonic()
    with pytest.raises(LLMError) as info:
        provider.complete(messages=USER_HI)
    assert info.value.retry_after == 600
    assert time.monotonic() - started < 5
    assert fake_llm.count() == 1


def test_a_stream_honours_retry_after_short_or_long(provider, fake_llm, mode):
    """Read from a streamed response's headers, which the provider gets before the body."""
    fake_llm.fail_next("429", retry_after=0.3)
    started = time.monotonic()
    assert stream(provider, mode, messages=USER_HI)[-1].text.startswith("Echo:")
    assert time.monotonic() - started >= 0.3
    fake_llm.fail_next("429", retry_after=600)
    with pytest.raises(LLMError) as info:
        stream(provider, mode, messages=USER_HI)
    assert info.value.retry_after == 600
    assert fake_llm.count() == 3


def test_connect_refused_is_retried_until_the_server_appears():
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
        assert provider.complete(messages=USER_HI).text.startswith("Echo:")
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


def test_persistent_timeout_raises_a_retryable_error(fake_llm):
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
        provider.complete(messages=USER_HI)
    assert info.value.retryable and "timed out" in str(info.value)
    assert 0.6 <= time.monotonic() - started < 5
    assert fake_llm.count() == 2


def test_a_summary_waits_its_own_timeout_not_the_chat_one(fake_llm, settings):
    """A small server writes a whole summary before its first byte: longer than the gap a
    reply's tokens may leave (LLM_TIMEOUT_SECONDS), shorter than LLM_SUMMARY_TIMEOUT_SECONDS.
    Issue 25: summary calls timed out under the 60 s chat timeout on SmolLM2."""
    from chat.llm import get_provider

    settings.LLM_TIMEOUT_SECONDS = 0.3
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 5.0
    settings.LLM_MAX_RETRIES = 0
    fake_llm.fail_next("hang", seconds=1.0)
    started = time.monotonic()
    assert get_provider().complete(messages=USER_HI).text.startswith("Echo:")
    assert 0.9 < time.monotonic() - started < 4.5
    assert fake_llm.count() == 1  # answered, not timed out and retried
    # Its own timeout still bounds it.
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 0.3
    fake_llm.fail_next("hang", seconds=2.0)
    started = time.monotonic()
    with pytest.raises(LLMError, match=r"(?i)timed? ?out"):
        get_provider().complete(messages=USER_HI)
    assert time.monotonic() - started < 1.5
    # A caller that says how long to wait is obeyed (a probe made for a reply).
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 5.0
    fake_llm.fail_next("hang", seconds=2.0)
    started = time.monotonic()
    with pytest.raises(LLMError, match=r"(?i)timed? ?out"):
        get_provider().complete(messages=USER_HI, timeout=0.3)
    assert time.monotonic() - started < 1.5
