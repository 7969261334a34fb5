"""A repeated client_id while the first send's reply still streams: every transport answers
alike (the user message, the reply's partial, the rest as it comes) and ends with `done`
carrying the reply in its final status, never `streaming`. Over server-sent events this once
ended at once with a `done` whose message was still streaming.

The first send is made over a WebSocket on the test's loop, so the reply runs in this process;
the repeats go through the real ASGI application (httpx's ASGI transport for REST). A reply
generated "in another process" is a streaming row this process only reads; a crashed one is a
streaming row nobody has written for longer than the stale rule."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async
from django.utils import timezone
from rest_framework.authtoken.models import Token

from cadau.asgi import application
from chat.models import STALE_STREAMING_SECONDS, ChatMessage, MessageRole, MessageStatus
from chat.shapes import done_event
from chat.turn.replies import reply_finish, reply_progress
from tests.chat.wsclient import TIMEOUT, login_cookie, loop_left_clean, socket_for  # noqa: F401
from tests.factories import ChatSessionFactory
from tests.helpers import sse_parse

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = " ".join(f"w{i}" for i in range(40))


@pytest.fixture
def session(owner):
    return ChatSessionFactory(owner=owner)


@pytest.fixture
def token(owner) -> str:
    return Token.objects.create(user=owner).key


async def _open(session_id: int, cookie: str) -> Any:
    ws = socket_for(session_id, cookie)
    connected, _ = await ws.connect(timeout=TIMEOUT)
    assert connected
    return ws


async def _until(ws: Any, kind: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != kind:
        seen.append(await ws.receive_json_from(timeout=TIMEOUT))
    return seen


async def _first_send_streaming(session: Any, owner: Any) -> Any:
    """A WebSocket send with client_id "same", read until its reply streams: a socket open
    on the session, for the repeat to race against."""
    ws = await _open(session.pk, await database_sync_to_async(login_cookie)(owner))
    await ws.send_json_to({"type": "send", "content": "go", "client_id": "same"})
    await _until(ws, "delta")
    return ws


async def _post(token: str, payload: dict[str, Any], *, stream: bool) -> httpx.Response:
    headers = {"Authorization": f"Token {token}"}
    if stream:
        headers["Accept"] = "text/event-stream"
    transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        return await client.post("/api/v1/chat/send", json=payload, headers=headers, timeout=20)


def _text(events: list[dict[str, Any]], held: str) -> str:
    """The reply a client builds: the partial it was given, each delta placed at its offset."""
    text = held
    for event in events:
        if event["type"] == "delta":
            assert event["offset"] <= len(text), (event["offset"], len(text))  # no gap
            text = text[: event["offset"]] + event["text"]
    return text


def _assert_alike(events: list[dict[str, Any]], *, content: str) -> None:
    """message (the user's), message (the streaming partial), deltas, done (final)."""
    assert [e["type"] for e in events[:2]] == ["message", "message"], events[:2]
    assert events[0]["message"]["role"] == "user"
    partial = events[1]["message"]
    assert partial["role"] == "assistant" and partial["status"] == "streaming"
    assert events[-1]["type"] == "done"
    assert events[-1]["message"]["status"] == "complete"
    assert events[-1]["message"]["content"] == content
    assert _text(events[2:-1], partial["content"]) == content
    assert not [e for e in events if e["type"] == "done" and e is not events[-1]]


async def test_sse_repeat_during_a_live_reply_follows_it_to_a_final_done(
    session, owner, token, fake_llm
):
    fake_llm.script({"content": WORDS, "token_ms": 30})
    ws = await _first_send_streaming(session, owner)
    response = await _post(
        token, {"session_id": session.pk, "content": "go", "client_id": "same"}, stream=True
    )
    assert response.status_code == 200, response.text
    _assert_alike(sse_parse(response.text), content=WORDS)
    assert fake_llm.count("chat") == 1
    await ws.disconnect()


async def test_websocket_repeat_during_a_live_reply_answers_as_sse_does(session, owner, fake_llm):
    fake_llm.script({"content": WORDS, "token_ms": 30})
    first = await _first_send_streaming(session, owner)
    again = await _open(session.pk, await database_sync_to_async(login_cookie)(owner))
    await again.send_json_to({"type": "send", "content": "go", "client_id": "same"})
    seen = await _until(again, "done")
    # The socket joined mid-reply (its resume came first) and is in the session's group:
    # deltas it got before its repeat's report are of the same reply; the report starts at
    # the user message.
    start = next(
        i for i, e in enumerate(seen) if e["type"] == "message" and e["message"]["role"] == "user"
    )
    _assert_alike(seen[start:], content=WORDS)
    assert fake_llm.count("chat") == 1
    await first.disconnect()
    await again.disconnect()


async def test_json_repeat_during_a_live_reply_waits_for_the_final_reply(
    session, owner, token, fake_llm
):
    fake_llm.script({"content": WORDS, "token_ms": 20})
    ws = await _first_send_streaming(session, owner)
    response = await _post(
        token, {"session_id": session.pk, "content": "go", "client_id": "same"}, stream=False
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["assistant_message"]["status"] == "complete"
    assert body["assistant_message"]["content"] == WORDS
    assert body["context_budget"] is not None
    await ws.disconnect()


def _turn_streaming(session: Any, *, client_id: str, age_seconds: float = 0) -> ChatMessage:
    """A turn whose reply another process is generating (or was, before it died)."""
    user = ChatMessage.objects.create(
        session=session, role=MessageRole.USER, content="go", client_id=client_id
    )
    reply = ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="Hel",
        status=MessageStatus.STREAMING,
        metadata={"reply_to": user.pk},
    )
    if age_seconds:
        ChatMessage.objects.filter(pk=reply.pk).update(
            updated_at=timezone.now() - timedelta(seconds=age_seconds)
        )
    return reply


async def test_sse_repeat_follows_a_reply_generated_in_another_process(session, token):
    reply = await database_sync_to_async(_turn_streaming)(session, client_id="elsewhere")

    async def elsewhere() -> None:
        # What the generating process writes: progress saves, then the final write.
        await asyncio.sleep(0.4)
        await database_sync_to_async(reply_progress)(message_id=reply.pk, content="Hello, wo")
        await asyncio.sleep(0.4)
        await database_sync_to_async(reply_finish)(
            message=reply, session=session, content="Hello, world", status="complete"
        )

    writer = asyncio.ensure_future(elsewhere())
    response = await _post(
        token, {"session_id": session.pk, "content": "go", "client_id": "elsewhere"}, stream=True
    )
    await writer
    events = sse_parse(response.text)
    _assert_alike(events, content="Hello, world")
    assert events[1]["message"]["content"] == "Hel"
    assert [e["type"] for e in events[2:-1]] == ["delta", "delta"]


async def test_sse_repeat_of_a_reply_whose_process_died_ends_with_it_failed(session, token):
    reply = await database_sync_to_async(_turn_streaming)(
        session, client_id="crashed", age_seconds=STALE_STREAMING_SECONDS + 5
    )
    response = await _post(
        token, {"session_id": session.pk, "content": "go", "client_id": "crashed"}, stream=True
    )
    events = sse_parse(response.text)
    assert [e["type"] for e in events] == ["message", "message", "done"]
    assert events[-1]["message"]["id"] == reply.pk
    assert events[-1]["message"]["status"] == "failed"
    assert events[-1]["message"]["content"] == "Hel"  # what it had is kept


def test_done_refuses_a_reply_still_streaming():
    with pytest.raises(ValueError, match="final reply"):
        done_event(message={"id": 1, "status": "streaming"}, context_budget=None)
