"""A one-slot model server shared by replies and background summaries (chat/llm/slots.py,
LLM_SERVER_SLOTS=1): a summary running when a reply starts gives the server up at once, in this
process or another, so the reply does not queue behind it (issue 25: first token after
130-219 s on llama-cpp-python)."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.cache import cache

from chat.llm import get_provider, slots
from chat.llm.base import SUMMARY_MARKER, Preempted
from tests.llm.conftest import USER_HI

SUMMARY = [
    {"role": "system", "content": f"{SUMMARY_MARKER} Compress."},
    {"role": "user", "content": "user: the server runs on port 8080.\nassistant: noted."},
]
# A summary the fake streams for ~4 s at 100 ms a word.
LONG_DIGEST = " ".join(f"fact{i}" for i in range(40))


@pytest.fixture
def one_slot(fake_llm, settings):
    settings.LLM_SERVER_SLOTS = 1
    cache.delete(slots.SHARED_KEY)
    yield fake_llm
    cache.delete(slots.SHARED_KEY)


def _summary_in_background(outcome: list) -> threading.Thread:
    def run() -> None:
        try:
            with slots.background(timeout=5):
                outcome.append(get_provider().complete(messages=SUMMARY, max_tokens=200))
        except Exception as exc:  # the test reads what it raised
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for_summary_streaming(fake_llm) -> None:
    deadline = time.monotonic() + 5
    while not any(c.kind == "summary" and c.started_at for c in fake_llm.calls):
        assert time.monotonic() < deadline, "the summary call never started"
        time.sleep(0.01)
    time.sleep(0.3)  # a few of its words out


def test_a_running_summary_gives_the_server_up_when_a_reply_starts(one_slot):
    """llama.cpp's own server with one slot: a request waits for the running one; the
    summary's connection is shut from the reply's start, so the reply is served at once."""
    one_slot.configure(slots=1, interrupt_requests=False, token_ms=100)
    one_slot.script_summary(LONG_DIGEST)
    outcome: list = []
    thread = _summary_in_background(outcome)
    _wait_for_summary_streaming(one_slot)
    started = time.monotonic()
    slots.reply_started()
    try:
        thread.join(timeout=2)
        assert not thread.is_alive()
        assert isinstance(outcome[0], Preempted), outcome
        # The reply's own call is served now, not after the ~4 s summary.
        one_slot.configure(token_ms=0)
        assert get_provider().complete(messages=USER_HI, timeout=5).text.startswith("Echo:")
        assert time.monotonic() - started < 2.0
    finally:
        slots.reply_ended()


def test_a_server_that_interrupts_the_summary_for_a_reply_reads_as_preempted(one_slot):
    """llama-cpp-python ends the running stream when another request arrives, with no finish
    reason: a background summary cut that way is not taken for a whole one."""
    one_slot.configure(slots=1, interrupt_requests=True, token_ms=100)
    one_slot.script_summary(LONG_DIGEST)
    outcome: list = []
    thread = _summary_in_background(outcome)
    _wait_for_summary_streaming(one_slot)
    started = time.monotonic()
    # A reply from another process: this one does not see it start.
    assert get_provider().complete(messages=USER_HI, timeout=5).text.startswith("Echo:")
    assert time.monotonic() - started < 2.0
    thread.join(timeout=5)
    assert isinstance(outcome[0], Preempted), outcome


def test_replies_in_other_processes_hold_background_work_back(one_slot):
    """Counted in the shared cache: before a background call starts, and between its chunks."""
    cache.set(slots.SHARED_KEY, 1)  # another process is generating a reply
    assert slots.replies_in_flight()
    started = time.monotonic()
    assert slots.idle_wait(timeout=0.4) is False
    assert time.monotonic() - started >= 0.4
    cache.set(slots.SHARED_KEY, 0)
    assert slots.idle_wait(timeout=0.4) is True
    # A call already running gives the server up when the other process's reply starts.
    one_slot.configure(slots=1, interrupt_requests=False, token_ms=100)
    one_slot.script_summary(LONG_DIGEST)
    outcome: list = []
    thread = _summary_in_background(outcome)
    _wait_for_summary_streaming(one_slot)
    cache.set(slots.SHARED_KEY, 1)
    thread.join(timeout=3)
    assert not thread.is_alive()
    assert isinstance(outcome[0], Preempted), outcome


def test_this_process_counts_its_replies_in_the_shared_cache_only_with_one_slot(fake_llm, settings):
    cache.delete(slots.SHARED_KEY)
    settings.LLM_SERVER_SLOTS = 0
    slots.reply_started()
    assert cache.get(slots.SHARED_KEY) is None  # no cache round trip on a many-slot server
    slots.reply_ended()
    settings.LLM_SERVER_SLOTS = 1
    slots.reply_started()
    slots.reply_started()
    assert slots.shared_replies() == 2
    slots.reply_ended()
    slots.reply_ended()
    assert slots.shared_replies() == 0
    assert not slots.replies_in_flight()


def test_a_summary_with_no_reply_about_is_whole(one_slot):
    one_slot.configure(slots=1, token_ms=0)
    one_slot.script_summary("the server runs on port 8080")
    with slots.background(timeout=5):
        result = get_provider().complete(messages=SUMMARY, max_tokens=200)
    assert result.text == "the server runs on port 8080"
    assert result.finish_reason == "stop"
    summary = next(c for c in one_slot.calls if c.kind == "summary")
    assert summary.body.get("stream") is True  # streamed, so that it could have yielded
