"""TurnRun.ready (chat/turn/service.py): a queued send's store outlives a caller that left.
The case the caller would have been told of, and now no one is: a store that fails after."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from chat.errors import NotFound
from chat.turn import service as turn_service
from chat.turn.checks import SendRequest
from chat.turn.service import TurnRun


@pytest.mark.parametrize(
    ("error", "level", "said"),
    [
        (RuntimeError("database gone"), logging.WARNING, "database gone"),
        (NotFound(), logging.INFO, "error=NotFound"),
    ],
)
async def test_a_store_that_fails_after_the_caller_left_is_logged(
    monkeypatch, caplog, error, level, said
):
    caplog.set_level(logging.INFO, logger="chat.realtime")
    entered, release = threading.Event(), threading.Event()

    def store_failing_late(**kwargs: Any) -> Any:
        entered.set()
        assert release.wait(5)
        raise error

    monkeypatch.setattr(turn_service, "_run_store", store_failing_late)
    monkeypatch.setattr(turn_service, "QUEUE_POLL_SECONDS", 0)
    run = TurnRun(send=SendRequest(user=None, session_id=1, content="hi", client_id=None))
    waiting = asyncio.ensure_future(run.ready(stream=False))
    while not entered.is_set():
        await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    for _ in range(100):
        if "chat_send_not_stored" in caplog.text:
            break
        await asyncio.sleep(0.02)
    [record] = [r for r in caplog.records if r.message.startswith("chat_send_not_stored")]
    assert record.levelno == level
    assert said in caplog.text
    assert run.queued  # nothing was taken, nothing started
