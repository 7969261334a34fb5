"""Scale-out for real: two Daphne processes on two ports share the PostgreSQL test database and
Redis; a WebSocket client on process A sees, live, the reply to a send made on process B (over
REST and over a WebSocket), and a cancel sent to A stops a reply generated on B.

Runs only when DATABASE_URL is PostgreSQL and REDIS_URL is set (CI's second pass); SQLite and
the in-memory layer cannot be shared between processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from django.conf import settings
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token

from bench.procs import ServerProcess, database_url
from chat.models import ChatMessage, MessageStatus
from devtools.fakellm import FakeLLMServer
from tests.factories import ChatSessionFactory, UserFactory
from tests.helpers import sse_parse

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(
        "postgresql" not in settings.DATABASES["default"]["ENGINE"] or not settings.REDIS_URL,
        reason="needs DATABASE_URL=postgres://... and REDIS_URL (processes share both)",
    ),
]


@pytest.fixture
def fake_llm_slow(fake_llm_server: FakeLLMServer) -> Iterator[FakeLLMServer]:
    fake_llm_server.reset()
    try:
        yield fake_llm_server
    finally:
        fake_llm_server.reset()


@pytest.fixture
def two_daphnes(
    transactional_db, fake_llm_slow, tmp_path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = dict(os.environ)
    env.update(
        # pytest-django renamed the database (test_<name>); the children must use that one.
        DATABASE_URL=database_url(connection.settings_dict),
        REDIS_URL=settings.REDIS_URL,
        # A prefix of our own: no stale groups from earlier runs, no crosstalk with other runs.
        REDIS_PREFIX=f"cadau-scaleout-{uuid.uuid4().hex[:8]}",
        # Session cookies are verified with the secret key: the children must share ours.
        SECRET_KEY=settings.SECRET_KEY,
        LLM_BASE_URL=fake_llm_slow.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="fake-chat",
        DEBUG="false",
        CHAT_BACKGROUND_COMPACTION="false",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    servers = (
        ServerProcess.app(env=env, log_path=tmp_path / "daphne-a.log"),
        ServerProcess.app(env=env, log_path=tmp_path / "daphne-b.log"),
    )
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def alice(transactional_db) -> dict[str, Any]:
    user: Any = UserFactory(username="alice")
    client = Client()
    client.force_login(user)
    return {
        "user": user,
        "cookie": client.cookies["sessionid"].value,
        "token": Token.objects.create(user=user).key,
        "session": ChatSessionFactory(owner=user),
    }


def _ws(server: ServerProcess, session_id: int, cookie: str) -> Any:
    return websockets.connect(
        f"ws://127.0.0.1:{server.port}/ws/chat/{session_id}/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": server.url},
        open_timeout=10,
    )


async def _events_until_done(ws: Any, *, timeout: float = 15.0) -> list[tuple[float, dict]]:
    """(receive time, event) up to and including `done`."""
    out: list[tuple[float, dict]] = []
    async with asyncio.timeout(timeout):
        while True:
            event = json.loads(await ws.recv())
            out.append((time.monotonic(), event))
            if event["type"] == "done":
                return out


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def _without_deltas(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] != "delta"]


def _text(events: list[dict], held: str = "") -> str:
    """The reply text a client builds from `held` (a resumed partial) and the deltas, placing
    each piece at its offset as the UI does."""
    text = held
    for e in events:
        if e["type"] == "delta":
            assert e["offset"] <= len(text), (e["offset"], len(text))  # no gap
            text = text[: e["offset"]] + e["text"]
    return text


async def test_a_socket_joining_mid_reply_on_another_process_gets_all_of_it_once(
    two_daphnes, alice, fake_llm_slow
):
    """Deltas cross processes only once a socket there asks (chat.watch); the generating
    process then sends the text so far, and the socket never gets a piece twice."""
    a, b = two_daphnes
    session = alice["session"]
    fake_llm_slow.script({"content": _words(60), "token_ms": 25})
    async with _ws(b, session.pk, alice["cookie"]) as on_b:
        await on_b.send(json.dumps({"type": "send", "content": "go"}))
        seen_b: list[dict] = []
        while len([e for e in seen_b if e["type"] == "delta"]) < 15:
            seen_b.append(json.loads(await on_b.recv()))
        async with _ws(a, session.pk, alice["cookie"]) as on_a:
            seen_a = [e for _, e in await _events_until_done(on_a)]
        seen_b += [e for _, e in await _events_until_done(on_b)]
    assert seen_a[0]["type"] == "message" and seen_a[0]["message"]["status"] == "streaming"
    held = seen_a[0]["message"]["content"]
    deltas_a = [e for e in seen_a if e["type"] == "delta"]
    assert deltas_a, seen_a
    # Every piece A got starts where A's text ends: nothing twice, nothing missing.
    text = held
    for e in deltas_a:
        assert e["offset"] == len(text), (e["offset"], len(text))
        text += e["text"]
    assert text == _words(60) == _text(seen_b)
    assert seen_a[-1]["type"] == "done" and seen_a[-1]["message"]["content"] == _words(60)


async def test_a_socket_on_process_a_sees_live_a_rest_send_on_process_b(
    two_daphnes, alice, fake_llm_slow
):
    a, b = two_daphnes
    session = alice["session"]
    fake_llm_slow.script({"content": _words(15), "token_ms": 30})
    async with _ws(a, session.pk, alice["cookie"]) as watcher:

        def rest_send() -> tuple[float, httpx.Response]:
            r = httpx.post(
                b.url + "/api/v1/chat/send",
                json={"session_id": session.pk, "content": "hello from B"},
                headers={"Authorization": f"Token {alice['token']}"},
                timeout=20,
            )
            return time.monotonic(), r

        rest = asyncio.ensure_future(asyncio.to_thread(rest_send))
        events = await _events_until_done(watcher)
        rest_done_at, response = await rest
    assert response.status_code == 200, response.text
    kinds = [e["type"] for _, e in events]
    assert kinds[0] == "message" and kinds[-1] == "done"
    assert events[0][1]["message"]["content"] == "hello from B"
    deltas = [(t, e) for t, e in events if e["type"] == "delta"]
    assert "".join(e["text"] for _, e in deltas) == _words(15)
    # Live: the pieces arrived spread over the reply, well before B answered the POST.
    assert deltas[-1][0] - deltas[0][0] > 0.2
    assert deltas[0][0] < rest_done_at - 0.2
    assert response.json()["assistant_message"]["id"] == events[-1][1]["message"]["id"]


async def test_a_websocket_send_on_b_streams_to_a_and_a_cancel_on_a_stops_it(
    two_daphnes, alice, fake_llm_slow
):
    a, b = two_daphnes
    session = alice["session"]
    fake_llm_slow.script(
        {"content": _words(8), "token_ms": 20},
        {"content": _words(300), "token_ms": 40},
    )
    async with (
        _ws(a, session.pk, alice["cookie"]) as on_a,
        _ws(b, session.pk, alice["cookie"]) as on_b,
    ):
        # 1. A send over the socket on B, watched from A.
        await on_b.send(json.dumps({"type": "send", "content": "first", "client_id": "k1"}))
        seen_a = [e for _, e in await _events_until_done(on_a)]
        seen_b = [e for _, e in await _events_until_done(on_b)]
        # The same events; only how the text is cut into deltas may differ (B's own socket gets
        # every token, A may get a first piece holding what streamed before it asked).
        assert _without_deltas(seen_a) == _without_deltas(seen_b)
        assert _text(seen_a) == _text(seen_b) == _words(8)
        assert seen_a[-1]["message"]["content"] == _words(8)

        # 2. A long reply generated on B, cancelled through A: the cancel crosses processes.
        await on_b.send(json.dumps({"type": "send", "content": "second"}))
        while json.loads(await on_a.recv())["type"] != "delta":
            pass
        sent_at = time.monotonic()
        await on_a.send(json.dumps({"type": "cancel"}))
        done = (await _events_until_done(on_a))[-1]
        elapsed = done[0] - sent_at
        assert done[1]["message"]["status"] == "cancelled"
        assert elapsed < 0.2, elapsed
    stored = await asyncio.to_thread(
        lambda: list(ChatMessage.objects.filter(session=session).order_by("id"))
    )
    assert [m.status for m in stored] == [
        MessageStatus.COMPLETE,
        MessageStatus.COMPLETE,
        MessageStatus.COMPLETE,
        MessageStatus.CANCELLED,
    ]
    assert stored[-1].content and "w299" not in stored[-1].content


async def test_refusals_hold_on_a_real_server(two_daphnes, alice):
    a, _ = two_daphnes
    session = alice["session"]
    for headers in (
        {"Origin": a.url},  # no session cookie
        {"Origin": "http://evil.example", "Cookie": f"sessionid={alice['cookie']}"},
    ):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(
                f"ws://127.0.0.1:{a.port}/ws/chat/{session.pk}/", additional_headers=headers
            ):
                pass
        assert refused.value.response.status_code == 403


# --- a repeated client_id on the other process while the reply streams ---------------------
# Over server-sent events the repeat follows the reply from the rows the generating process
# saves; over a WebSocket from the session's group. Both end with `done` carrying the reply
# complete, never `streaming`.


def _assert_final(events: list[dict[str, Any]], content: str) -> None:
    done = [e for e in events if e["type"] == "done"]
    assert len(done) == 1 and events[-1] is done[0], [e["type"] for e in events]
    assert done[0]["message"]["status"] == "complete"
    assert done[0]["message"]["content"] == content


async def _started_on(server: Any, session_id: int, cookie: str, client_id: str) -> Any:
    """A WebSocket send on `server`, read until its reply has streamed a few pieces."""
    ws = await _ws(server, session_id, cookie).__aenter__()
    await ws.send(json.dumps({"type": "send", "content": "go", "client_id": client_id}))
    deltas = 0
    while deltas < 5:
        if json.loads(await ws.recv())["type"] == "delta":
            deltas += 1
    return ws


async def test_sse_repeat_on_another_process_follows_the_live_reply(
    two_daphnes, alice, fake_llm_slow
):
    a, b = two_daphnes
    session = alice["session"]
    fake_llm_slow.script({"content": _words(60), "token_ms": 25})
    first = await _started_on(a, session.pk, alice["cookie"], "twice")

    def repeat() -> httpx.Response:
        return httpx.post(
            b.url + "/api/v1/chat/send",
            json={"session_id": session.pk, "content": "go", "client_id": "twice"},
            headers={"Authorization": f"Token {alice['token']}", "Accept": "text/event-stream"},
            timeout=30,
        )

    response = await asyncio.to_thread(repeat)
    await _events_until_done(first)
    await first.close()
    assert response.status_code == 200, response.text
    events = sse_parse(response.text)
    assert events[0]["type"] == "message" and events[0]["message"]["role"] == "user"
    partial = events[1]["message"]
    assert events[1]["type"] == "message" and partial["status"] == "streaming"
    _assert_final(events, _words(60))
    assert _text(events[2:-1], partial["content"]) == _words(60)
    assert fake_llm_slow.count("chat") == 1


async def test_websocket_repeat_on_another_process_answers_as_sse_does(
    two_daphnes, alice, fake_llm_slow
):
    a, b = two_daphnes
    session = alice["session"]
    fake_llm_slow.script({"content": _words(60), "token_ms": 25})
    first = await _started_on(a, session.pk, alice["cookie"], "twice")
    async with _ws(b, session.pk, alice["cookie"]) as again:
        await again.send(json.dumps({"type": "send", "content": "go", "client_id": "twice"}))
        seen = [e for _, e in await _events_until_done(again, timeout=30)]
    await _events_until_done(first)
    await first.close()
    report = next(
        i for i, e in enumerate(seen) if e["type"] == "message" and e["message"]["role"] == "user"
    )
    assert seen[report + 1]["type"] == "message"
    assert seen[report + 1]["message"]["status"] == "streaming"
    _assert_final(seen, _words(60))
    assert fake_llm_slow.count("chat") == 1
