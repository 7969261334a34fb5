"""LLM fixtures: a real fake OpenAI-compatible server on loopback, and settings pointing at it.

    def test_something(fake_llm):            # fake_llm is the FakeLLMServer, already reset
        fake_llm.script("Hello!")            # next chat reply
        fake_llm.script_summary("digest")    # next summary reply (marker: SUMMARY_MARKER)
        fake_llm.fail_next("500", times=2)   # faults: see devtools.fakellm.FAULT_KINDS
        ...
        assert fake_llm.count("summary") == 1

Tests that do not request `fake_llm` run with whatever LLM_BASE_URL the environment has; the
test settings leave it empty, so they get the offline provider.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chat.context.guard import SUMMARY_HEADINGS
from chat.llm import reset_provider
from devtools.fakellm import FakeLLMServer


def summary_of(facts: str) -> str:
    """A summary the guard accepts (chat/context/guard.py: every section heading), saying
    `facts` under the first: what a scripted model answers when a test needs its summary
    committed as written."""
    sections = [f"## {SUMMARY_HEADINGS[0]}\n- {facts}"]
    sections += [f"## {heading}\n- (none recorded)" for heading in SUMMARY_HEADINGS[1:]]
    return "\n\n".join(sections)


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer(host="127.0.0.1", port=0).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer, settings) -> Iterator[FakeLLMServer]:
    fake_llm_server.reset()
    settings.LLM_BASE_URL = fake_llm_server.base_url
    settings.LLM_API_KEY = "test-key"
    settings.LLM_MODEL = "fake-chat"
    settings.LLM_SUMMARY_MODEL = "fake-summary"
    # Short enough that a "hang" fault fails a test in about a second, long enough for a
    # loaded CI machine to stream a normal reply.
    settings.LLM_TIMEOUT_SECONDS = 1.0
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 1.0
    settings.LLM_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.LLM_MAX_RETRIES = 2
    settings.LLM_RETRY_BACKOFF_SECONDS = 0.01
    reset_provider()
    try:
        yield fake_llm_server
    finally:
        # Wake handlers still hanging on a fault so they do not leak into the next test.
        fake_llm_server.reset()
        reset_provider()
