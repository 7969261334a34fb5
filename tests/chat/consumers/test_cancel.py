"""Replies over the consumer that do not end normally: cancel (from the sender or another
socket, in a later tool round), a disconnect or reconnect mid-stream, upstream failures."""

from __future__ import annotations

import asyncio
import time

import pytest

from chat.models import ChatSession, MessageRole, MessageStatus
from chat.turn import registry
from tests.chat.consumers.helpers import (
    TIMEOUT,
    delta_text,
    messages_of,
    replies_settle,
)
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open
from tests.factories import ChatSessionFactory

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


async def test_cancel_stops_within_200ms_and_stores_the_partial_as_cancelled(
    session, owner_cookie, fake_llm
):
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "talk slowly"})
    before = await _until(ws, "delta")
    for _ in range(3):
        before.append(await ws.receive_json_from(timeout=TIMEOUT))
    sent_at = time.monotonic()
    await ws.send_json_to({"type": "cancel"})
    after = await _until(ws, "done")
    elapsed_ms = (time.monotonic() - sent_at) * 1000
    assert elapsed_ms < 200, elapsed_ms
    done = after[-1]
    assert done["message"]["status"] == "cancelled"
    streamed = delta_text(before + after)
    assert done["message"]["content"] == streamed and streamed.startswith("w0 w1 w2")
    stored = (await messages_of(session.pk))[-1]
    assert stored.status == MessageStatus.CANCELLED and stored.content == streamed
    await ws.disconnect()
    await replies_settle()
    assert registry.generation_running(session_id=session.pk) is None


async def test_cancel_from_another_socket_stops_the_reply(session, owner_cookie, fake_llm):
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40})
    sender = await _open(session.pk, owner_cookie)
    await sender.send_json_to({"type": "send", "content": "go"})
    await _until(sender, "delta")
    await sender.disconnect()
    stopper = await _open(session.pk, owner_cookie)
    await stopper.send_json_to({"type": "cancel"})
    done = (await _until(stopper, "done"))[-1]
    assert done["message"]["status"] == "cancelled"
    await stopper.disconnect()
    await replies_settle()


async def test_cancel_with_nothing_running_is_an_error_event(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "cancel"})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "nothing_to_cancel"
    await ws.disconnect()


@pytest.fixture
def agent_session(owner, settings, tmp_path) -> ChatSession:
    from tests.factories import AgentFactory

    settings.RUNTIME_DIR = tmp_path / "runtime"
    settings.AGENT_MEMORY_STORAGE = ""
    agent = AgentFactory.create(owner=owner, config_json={"tools": ["current_time"]})
    return ChatSessionFactory.create(owner=owner, agent=agent)


async def test_cancel_in_a_later_tool_round_finishes_the_row_being_written(
    agent_session, owner_cookie, fake_llm
):
    fake_llm.script(
        {"content": "", "tool_calls": [{"id": "t1", "name": "current_time", "arguments": {}}]},
        {"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40},
    )
    ws = await _open(agent_session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "what time is it, slowly"})
    before = await _until(ws, "tool_result")
    before += await _until(ws, "delta")
    await ws.send_json_to({"type": "cancel"})
    done = (await _until(ws, "done"))[-1]
    rows = await messages_of(agent_session.pk)
    final = rows[-1]
    # done names the second round's row (not the tool-call row), stored as cancelled
    assert done["message"]["id"] == final.pk
    assert final.role == MessageRole.ASSISTANT and final.status == MessageStatus.CANCELLED
    assert [r.role for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[1].tool_calls and rows[1].status == MessageStatus.COMPLETE
    await ws.disconnect()
    await replies_settle()


async def test_disconnect_mid_stream_still_stores_the_whole_reply(session, owner_cookie, fake_llm):
    words = " ".join(f"w{i}" for i in range(30))
    fake_llm.script({"content": words, "token_ms": 10})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "go on without me"})
    await _until(ws, "delta")
    await ws.disconnect()
    await replies_settle()
    stored = (await messages_of(session.pk))[-1]
    assert stored.status == MessageStatus.COMPLETE and stored.content == words


async def test_reconnect_mid_stream_resumes_from_the_partial(session, owner_cookie, fake_llm):
    words = " ".join(f"w{i}" for i in range(40))
    fake_llm.script({"content": words, "token_ms": 15})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "resume me"})
    await _until(ws, "delta")
    await ws.disconnect()
    await asyncio.sleep(0.15)
    again = await _open(session.pk, owner_cookie)
    first = await again.receive_json_from(timeout=TIMEOUT)
    assert first["type"] == "message"
    partial = first["message"]
    assert partial["role"] == "assistant" and partial["status"] == "streaming"
    assert partial["content"].startswith("w0 w1")
    rest = await _until(again, "done")
    # The partial plus what follows is the reply, with no piece twice.
    assert partial["content"] + delta_text(rest) == words == rest[-1]["message"]["content"]
    await again.disconnect()


async def test_upstream_cut_stores_the_partial_as_failed(session, owner_cookie, fake_llm):
    fake_llm.script("alpha beta gamma delta epsilon")
    fake_llm.fail_next("cut", after_tokens=2, target="chat")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "break please"})
    events = await _until(ws, "done")
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "done"]
    assert events[-2]["code"] == "llm_stream_cut"
    done = events[-1]["message"]
    assert done["status"] == "failed" and done["content"] == "alpha beta "
    assert done["content"] == delta_text(events)
    stored = (await messages_of(session.pk))[-1]
    assert (
        stored.status == MessageStatus.FAILED and stored.metadata["error_code"] == "llm_stream_cut"
    )
    await ws.disconnect()


async def test_llm_error_before_any_token_is_error_then_done(session, owner_cookie, fake_llm):
    fake_llm.fail_next("500", times=5, target="chat")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "fail"})
    events = await _until(ws, "done")
    assert [e["type"] for e in events][-2:] == ["error", "done"]
    assert events[-2]["code"] == "llm_error"
    assert events[-1]["message"]["status"] == "failed"
    await ws.disconnect()


async def test_a_cancel_right_behind_its_own_send_stops_that_reply(session, owner_cookie, fake_llm):
    # The send is still being stored when the cancel arrives: there was nothing to cancel
    # yet, and the reply ran to its end (a probe: 3 of 3 with no gap between the frames).
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 20})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "never mind"})
    await ws.send_json_to({"type": "cancel"})
    events = await _until(ws, "done")
    assert not [e for e in events if e["type"] == "error"], events
    assert events[-1]["message"]["status"] == "cancelled"
    await ws.disconnect()
    await replies_settle()
    assert registry.generation_running(session_id=session.pk) is None
    # The mark went with that reply: the next one runs to its end.
    fake_llm.script("all of it")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "again"})
    assert (await _until(ws, "done"))[-1]["message"]["status"] == "complete"
    await ws.disconnect()


async def test_a_cancel_behind_a_send_that_starts_no_reply_stops_no_later_one(
    session, owner_cookie, fake_llm
):
    # A repeated client_id starts no reply: the cancel asked ahead for one is forgotten, not
    # left to stop the next reply of the session.
    fake_llm.script("first")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "hello", "client_id": "c1"})
    assert (await _until(ws, "done"))[-1]["message"]["status"] == "complete"
    await replies_settle()
    assert registry.generation_running(session_id=session.pk) is None
    await ws.send_json_to({"type": "send", "content": "hello", "client_id": "c1"})
    await ws.send_json_to({"type": "cancel"})
    await _until(ws, "done")  # the repeat's report: the stored reply
    fake_llm.script("whole")
    await ws.send_json_to({"type": "send", "content": "a real one", "client_id": "c2"})
    events = await _until(ws, "done")
    assert events[-1]["message"]["status"] == "complete", events
    await ws.disconnect()
