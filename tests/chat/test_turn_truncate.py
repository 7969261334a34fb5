"""Edit and resend while a reply is streaming (chat/turn/truncate.py): the truncation stops the
reply first, so its final write never finds its row gone, and every subscriber (the sockets,
the reply's own event stream) gets a terminal `done` for it. Through the real ASGI application,
with the fake LLM server pacing the reply slowly so it is mid-stream."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator, HttpCommunicator, WebsocketCommunicator
from django.test import Client
from rest_framework.authtoken.models import Token

from cadau.asgi import application
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.turn import registry, service
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import ChatSessionFactory, make_conversation

# Autouse where it is imported: replies finish, and each test gets its own channel layer.
loop_left_clean = _loop_left_clean

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 5.0
SLOW = {"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40}


def _setup(owner: Any) -> tuple[ChatSession, list[int], str, str]:
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    earlier = [m.pk for m in make_conversation(session, turns=1)]
    client = Client()
    client.force_login(owner)
    token = Token.objects.create(user=owner).key
    return session, earlier, client.cookies["sessionid"].value, token


setup = database_sync_to_async(_setup)


def _rows(session_id: int) -> list[tuple[int, str]]:
    return list(
        ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("id", "status")
    )


rows_of = database_sync_to_async(_rows)


async def _open_socket(session_id: int, cookie: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application,
        f"/ws/chat/{session_id}/",
        headers=[
            (b"host", b"localhost"),
            (b"origin", b"http://localhost"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ],
    )
    connected, code = await ws.connect(timeout=TIMEOUT)
    assert connected, code
    return ws


async def _until(ws: WebsocketCommunicator, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        event = await ws.receive_json_from(timeout=max(deadline - time.monotonic(), 0.01))
        events.append(event)
        if event["type"] == kind:
            return events


def _api_headers(token: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"localhost"),
        (b"content-type", b"application/json"),
        (b"authorization", f"Token {token}".encode()),
    ]


async def _truncate(token: str, session_id: int, message_id: int) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"session_id": session_id, "message_id": message_id}).encode()
    http = HttpCommunicator(
        application,
        "POST",
        "/api/v1/chat/truncate",
        body=body,
        headers=[*_api_headers(token), (b"content-length", str(len(body)).encode())],
    )
    response = await http.get_response(timeout=TIMEOUT)
    return response["status"], json.loads(response["body"])


async def _settle() -> None:
    if service._tasks:
        await asyncio.wait_for(
            asyncio.gather(*list(service._tasks), return_exceptions=True), TIMEOUT
        )


async def test_truncating_over_a_streaming_reply_stops_it_and_sockets_get_done(
    owner, fake_llm, caplog
):
    session, earlier, cookie, token = await setup(owner)
    fake_llm.script(SLOW)
    ws = await _open_socket(session.pk, cookie)
    await ws.send_json_to({"type": "send", "content": "talk slowly"})
    before = await _until(ws, "delta")
    question = before[0]["message"]
    reply_id = before[-1]["message_id"]
    assert (await rows_of(session.pk))[-1] == (reply_id, MessageStatus.STREAMING)

    with caplog.at_level(logging.INFO):
        status, body = await _truncate(token, session.pk, question["id"])
    assert status == 200, body
    assert body["deleted"] == 2 and body["cancelled_reply_id"] == reply_id
    # The socket is told the reply ended: a terminal `done`, the partial kept as cancelled.
    done = (await _until(ws, "done"))[-1]
    assert done["message"]["id"] == reply_id
    assert done["message"]["status"] == "cancelled"
    assert done["message"]["content"].startswith("w0 ")
    await ws.disconnect()
    await _settle()
    assert [pk for pk, _ in await rows_of(session.pk)] == earlier
    assert "chat_reply_task_failed" not in caplog.text
    assert "chat_truncate_cancel" in caplog.text
    assert registry.generation_running(session_id=session.pk) is None


async def _sse_send(token: str, session_id: int) -> ApplicationCommunicator:
    body = json.dumps({"session_id": session_id, "content": "talk slowly"}).encode()
    comm = ApplicationCommunicator(
        application,
        {
            "type": "http",
            "http_version": "1.1",
            "method": "POST",
            "path": "/api/v1/chat/send",
            "raw_path": b"/api/v1/chat/send",
            "query_string": b"",
            "scheme": "http",
            "server": ("localhost", 80),
            "client": ("127.0.0.1", 50000),
            "headers": [
                *_api_headers(token),
                (b"accept", b"text/event-stream"),
                (b"content-length", str(len(body)).encode()),
            ],
        },
    )
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(TIMEOUT)
    assert start["type"] == "http.response.start" and start["status"] == 200, start
    return comm


async def _sse_events(comm: ApplicationCommunicator, *, until: str) -> list[dict[str, Any]]:
    """Server-sent events up to the first of type `until` (or the end of the stream)."""
    events: list[dict[str, Any]] = []
    buffer = b""
    deadline = time.monotonic() + TIMEOUT
    while True:
        message = await comm.receive_output(max(deadline - time.monotonic(), 0.01))
        buffer += message.get("body", b"")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            for line in block.split(b"\n"):
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
        if (events and events[-1]["type"] == until) or not message.get("more_body"):
            return events


async def test_truncating_over_a_rest_event_stream_ends_the_stream_with_done(
    owner, fake_llm, caplog
):
    session, earlier, _cookie, token = await setup(owner)
    fake_llm.script(SLOW)
    stream = await _sse_send(token, session.pk)
    before = await _sse_events(stream, until="delta")
    question, reply_id = before[0]["message"], before[-1]["message_id"]

    status, body = await _truncate(token, session.pk, question["id"])
    assert status == 200, body
    assert body["cancelled_reply_id"] == reply_id
    after = await _sse_events(stream, until="done")
    assert after[-1]["type"] == "done"
    assert after[-1]["message"]["id"] == reply_id
    assert after[-1]["message"]["status"] == "cancelled"
    await _settle()
    assert [pk for pk, _ in await rows_of(session.pk)] == earlier
    assert "chat_reply_task_failed" not in caplog.text


async def test_a_bad_truncation_while_streaming_is_a_404_and_stops_nothing(owner, fake_llm):
    session, earlier, cookie, token = await setup(owner)
    other = await database_sync_to_async(ChatSessionFactory.create)(owner=owner)
    foreign = (await database_sync_to_async(make_conversation)(other, turns=1))[0]
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(30)), "token_ms": 20})
    ws = await _open_socket(session.pk, cookie)
    await ws.send_json_to({"type": "send", "content": "go on"})
    await _until(ws, "delta")
    status, body = await _truncate(token, session.pk, foreign.pk)
    assert status == 404 and body["error"]["code"] == "not_found"
    done = (await _until(ws, "done"))[-1]
    assert done["message"]["status"] == "complete"
    await ws.disconnect()
    await _settle()
    assert len(await rows_of(session.pk)) == len(earlier) + 2


async def test_truncating_with_nothing_running_cancels_nothing(owner, fake_llm):
    session, earlier, _cookie, token = await setup(owner)
    status, body = await _truncate(token, session.pk, earlier[1])
    assert status == 200 and body["cancelled_reply_id"] is None and body["deleted"] == 1
