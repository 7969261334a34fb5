"""Sends through Cadau to a real model server (llama-cpp-python, SmolLM2-135M, n_ctx 1024)
under the default 48,000-rune budget (issue 13: the session used to be dead from the third
send on). Twenty long sends in a row, English and Chinese, over plain REST, server-sent events
and the WebSocket: once the conversation outgrows the model's window (the server then ends
each stream before its first event), Cadau learns the window, compacts, and every reply comes."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from cadau.asgi import application
from chat.models import ChatMessage, ContextSnapshot, MessageRole, MessageStatus
from chat.turn import service
from tests.factories import ChatSessionFactory
from tests.helpers import loop_transports_close, send_streaming

pytestmark = [pytest.mark.real_llm, pytest.mark.django_db(transaction=True)]

ENGLISH = (
    "Here is a long note about my garden. The tomatoes are planted along the south fence, the "
    "beans climb the old ladder, and the herbs grow in three pots near the kitchen door. "
)
CHINESE = "我的花园里有番茄、豆子和香草。番茄种在南边的篱笆旁，豆子爬在旧梯子上。"
# A reply of the 135M model takes seconds; a prompt near its window up to ~20 s to read.
REPLY_TIMEOUT = 300.0


def _ws_send(session_id: int, cookie: str, content: str) -> dict[str, Any]:
    """One send over the WebSocket through the real ASGI application; the `done` event's
    message (the row as stored, also after an `error`)."""

    async def go() -> dict[str, Any]:
        headers = [
            (b"host", b"localhost"),
            (b"origin", b"http://localhost"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ]
        ws = WebsocketCommunicator(application, f"/ws/chat/{session_id}/", headers=headers)
        connected, code = await ws.connect(timeout=30)
        assert connected, code
        await ws.send_json_to({"type": "send", "content": content, "client_id": str(uuid.uuid4())})
        deadline = time.monotonic() + REPLY_TIMEOUT
        try:
            while True:
                event = await ws.receive_json_from(timeout=max(deadline - time.monotonic(), 0.1))
                if event["type"] == "done":  # after an `error`, if any: the row as stored
                    return dict(event["message"])
        finally:
            await ws.disconnect()
            if service._tasks:
                await asyncio.gather(*list(service._tasks), return_exceptions=True)
            await loop_transports_close()

    try:
        return asyncio.run(go())
    finally:
        # A layer per loop, as each server process has one (channels-redis keeps loop state).
        channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


# llama-cpp-python's own failure: a reply that generates up to the end of the window is not
# ended with finish_reason "length" but crashes the server's generator ("RuntimeError:
# llama_decode returned 1", the KV cache full, in its log), and the stream just stops
# (docs/real-llm-notes.md). Cadau keeps what arrived, `failed` with `llm_stream_cut`.
SERVER_CRASH = "llama_decode returned 1"


def _reply_ok(reply: dict[str, Any], *, server_log: str) -> bool:
    """Complete, or cut by the server's own crash (above) with the text that arrived kept."""
    if reply["status"] == MessageStatus.COMPLETE:
        return True
    return (
        reply["metadata"].get("error_code") == "llm_stream_cut"
        and SERVER_CRASH in server_log
        and bool(reply["content"].strip())
    )


def test_twenty_long_sends_past_the_models_window_all_complete(api, owner, real_llm, settings):
    # As README says to run Cadau with llama-cpp-python: one slot.
    settings.LLM_SERVER_SLOTS = 1
    session = ChatSessionFactory(owner=owner)
    browser = Client()
    browser.force_login(owner)
    cookie = browser.cookies["sessionid"].value
    sends = []
    for i in range(20):
        if (i // 2) % 2 == 0:
            sends.append(ENGLISH * 4 + f"Question {i}: what grows by the fence?")
        else:
            sends.append(CHINESE * 3 + f"问题 {i}：篱笆旁种了什么？")
    ways = []
    crashed = 0
    for i, content in enumerate(sends):
        way = ("rest", "sse", "websocket")[i % 3]
        ways.append(way)
        log_start = real_llm.log_path.stat().st_size
        if way == "sse":
            reply = send_streaming(api, session, content)[-1]["message"]
        elif way == "websocket":
            reply = _ws_send(session.pk, cookie, content)
        else:
            r = api.post(
                "/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json"
            )
            assert r.status_code == 200, r.content
            reply = r.json()["assistant_message"]
        with real_llm.log_path.open(errors="replace") as log:
            log.seek(log_start)
            server_log = log.read()
        assert _reply_ok(reply, server_log=server_log), (i, way, reply["metadata"])
        assert reply["content"].strip(), f"send {i} ({way}) got an empty reply"
        crashed += reply["status"] != MessageStatus.COMPLETE
    # The server's crash is rare (once in twenty sends in CI, never in most runs).
    assert crashed <= 2
    stored = list(ChatMessage.objects.filter(session=session, role=MessageRole.USER))
    assert [m.content for m in stored] == sends  # every message kept, in order
    replies = ChatMessage.objects.filter(session=session, role=MessageRole.ASSISTANT)
    assert replies.count() == 20
    assert set(ways) == {"rest", "sse", "websocket"}
    # The conversation outgrew the window, so it was compacted, and the summaries kept.
    session.refresh_from_db()
    assert session.context_summary
    assert ContextSnapshot.objects.filter(session=session, outcome="committed").exists()


# A longer Chinese turn than CHINESE * 3: at SmolLM2's 2-3 tokens a character, ~200 characters
# are ~500 tokens, half the window.
CHINESE_LONG = (
    "我的花园在城市的东边，南边的篱笆旁种着番茄，旧梯子上爬着豆子，厨房门口的三个花盆里长着香草。"
    "每年春天我都会在四月初播种，夏天的时候每天早上浇一次水，秋天收获以后把种子晒干留到明年。"
    "邻居王阿姨经常来帮忙，她教我用鸡蛋壳和咖啡渣做肥料，番茄因此长得又大又红。"
)


# A CPU model on a shared machine: a send that waits on a summary takes minutes here.
@pytest.mark.timeout(3600)
def test_eight_sends_mixing_long_english_and_chinese_turns_all_get_an_answer(
    api, owner, real_llm, settings
):
    """Issue 25: at n_ctx 1024, eight sends mixing long English and Chinese turns stored 3
    empty replies as complete (the trimmed payload still overflowed: Chinese costs SmolLM2 2-3
    tokens a character against an estimate learned from English, and llama-cpp-python answers
    a prompt that leaves no room with an empty "stop"). With one slot, as a small server is
    run, and the default budget: every reply has text, none is an empty "complete"."""
    settings.LLM_SERVER_SLOTS = 1
    session = ChatSessionFactory(owner=owner)
    sends = []
    for i in range(8):
        if i % 4 == 0:
            sends.append(ENGLISH * 4 + f"Question {i}: what grows by the fence?")
        elif i % 4 == 1:
            sends.append(CHINESE_LONG + f"问题 {i}：篱笆旁种了什么？")
        elif i % 4 == 2:  # both in one turn
            sends.append(ENGLISH * 2 + CHINESE_LONG[:100] + f" Question {i}: 番茄种在哪里？")
        else:
            sends.append(CHINESE_LONG * 2 + f"问题 {i}：邻居教了我什么？")
    outcomes = []
    for i, content in enumerate(sends):
        if i % 2:
            reply = send_streaming(api, session, content)[-1]["message"]
        else:
            r = api.post(
                "/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json"
            )
            assert r.status_code == 200, r.content
            reply = r.json()["assistant_message"]
        outcomes.append(
            (i, reply["status"], len(reply["content"].strip()), reply["metadata"].get("error_code"))
        )
        print("real_llm send", outcomes[-1], flush=True)  # the run's record under -s
    # Every reply has text. The figure (8 of 8 complete) is a benchmark reading, not
    # this test's bar: a CPU model can still run out of its 1,024-token window while writing a
    # long answer (one run here: 7 complete and one cut after 264 characters, kept as a
    # failed `llm_stream_cut`). What must never happen is an empty reply, or one stored as
    # complete with nothing in it.
    assert all(o[2] > 0 for o in outcomes), outcomes
    assert all(o[1] == MessageStatus.COMPLETE or o[3] == "llm_stream_cut" for o in outcomes), (
        outcomes
    )
    assert not ChatMessage.objects.filter(
        session=session, role=MessageRole.ASSISTANT, status=MessageStatus.COMPLETE, content=""
    ).exists()
