"""Bad input gets a clear 4xx in the API's JSON error shape and changes nothing (issue 14,
item 6): deep JSON, lone surrogates, NUL, bodies and frames over their limits, odd path ids and
entry names. One text check (chat/text.py) serves REST and the WebSocket alike."""

from __future__ import annotations

import json

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from cadau.asgi import application
from chat.models import Agent, ChatMessage
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import AgentFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db(transaction=True)
# Sockets' replies finish, and each test gets its own channel layer (Redis keeps loop state).
loop_left_clean = _loop_left_clean

DEEP = "[" * 100_000 + "]" * 100_000
SURROGATE = '"\\ud800"'  # JSON's escape for a lone surrogate: valid JSON, not valid Unicode


def _json_error(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("error"), dict) and body["error"].get("code"), body
    return body["error"]


def _raw(client, path: str, body: str | bytes, method: str = "post"):
    return getattr(client, method)(path, data=body, content_type="application/json")


@pytest.mark.parametrize("path", ["/api/v1/chat/send", "/api/v1/auth/token", "/api/v1/agents"])
def test_deeply_nested_json_is_a_400_everywhere(api, owner, path):
    error = _json_error(_raw(api, path, DEEP), 400)
    assert "nested" in error["message"] or "JSON" in error["message"]
    assert ChatMessage.objects.count() == 0 and Agent.objects.count() == 0


def test_deep_json_without_login_on_the_token_endpoint(anon_api):
    _json_error(_raw(anon_api, "/api/v1/auth/token", DEEP), 400)
    body = '{"username": ' + SURROGATE + ', "password": "x"}'
    _json_error(_raw(anon_api, "/api/v1/auth/token", body), 400)


def test_lone_surrogates_and_nul_in_agent_fields_change_nothing(api, owner):
    for value in (SURROGATE, '"a\\u0000b"'):
        body = '{"name": ' + value + ', "system_prompt": "hi"}'
        _json_error(_raw(api, "/api/v1/agents", body), 400)
    agent = AgentFactory(owner=owner, name="kept")
    body = '{"system_prompt": ' + SURROGATE + "}"
    _json_error(_raw(api, f"/api/v1/agents/{agent.pk}", body, method="patch"), 400)
    agent.refresh_from_db()
    assert agent.name == "kept" and agent.system_prompt == "You are a careful assistant."
    assert Agent.objects.count() == 1


def test_nul_and_surrogates_in_a_rest_send_are_refused(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    for value in (SURROGATE, '"a\\u0000b"'):
        body = '{"session_id": ' + str(session.pk) + ', "content": ' + value + "}"
        _json_error(_raw(api, "/api/v1/chat/send", body), 400)
    assert ChatMessage.objects.count() == 0 and fake_llm.count() == 0


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


async def _ws(session_id: int, owner) -> WebsocketCommunicator:
    cookie = await database_sync_to_async(_cookie)(owner)
    headers = [
        (b"host", b"localhost"),
        (b"origin", b"http://localhost"),
        (b"cookie", f"sessionid={cookie}".encode()),
    ]
    return WebsocketCommunicator(application, f"/ws/chat/{session_id}/", headers=headers)


@pytest.mark.parametrize(
    "frame",
    [
        DEEP,
        '{"type": "send", "content": ' + SURROGATE + "}",
        '{"type": "send", "content": "a\\u0000b"}',
        '{"type": "send", "content": "ok", "client_id": ' + SURROGATE + "}",
        # A key its type does not take, or a key given twice: as a REST body's.
        '{"type": "send", "content": "ok", "session_id": 1}',
        '{"type": "cancel", "message_id": 1}',
        '{"type": "send", "content": "ok", "content": "other"}',
        '{"type": "send", "content": NaN}',
    ],
    ids=[
        "deep",
        "surrogate",
        "nul",
        "surrogate-client-id",
        "unknown",
        "unknown-cancel",
        "twice",
        "nan",
    ],
)
async def test_bad_frames_get_an_error_event_and_the_socket_stays_open(owner, fake_llm, frame):
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    ws = await _ws(session.pk, owner)
    connected, _ = await ws.connect(timeout=5)
    assert connected
    await ws.send_to(text_data=frame)
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == "error" and event["code"] in ("bad_request", "invalid"), event
    # Still open: the next frame is answered.
    await ws.send_json_to({"type": "nope"})
    answer = await ws.receive_json_from(timeout=5)
    assert answer["type"] == "error" and "Unknown frame type" in answer["message"]
    await ws.disconnect()
    count = await database_sync_to_async(ChatMessage.objects.count)()
    assert count == 0 and fake_llm.count() == 0


async def test_a_frame_is_measured_in_bytes_not_characters(owner, settings):
    """1,000 Chinese characters are 3,000 bytes: over a 2,048-byte limit though only 1,000
    characters long."""
    settings.WS_MAX_FRAME_BYTES = 2048
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    ws = await _ws(session.pk, owner)
    assert (await ws.connect(timeout=5))[0]
    frame = json.dumps({"type": "send", "content": "汉" * 1000}, ensure_ascii=False)
    assert len(frame) < 2048 < len(frame.encode())
    await ws.send_to(text_data=frame)
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == "error" and "2048 bytes" in event["message"]
    await ws.disconnect()
    assert await database_sync_to_async(ChatMessage.objects.count)() == 0


def _asgi() -> httpx.AsyncClient:
    """The whole ASGI application, body limit included, as a server runs it."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),  # type: ignore[arg-type]
        base_url="http://localhost",
    )


async def test_a_body_over_the_limit_is_a_json_413_and_nothing_is_stored(owner):
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    big = json.dumps({"session_id": session.pk, "content": "x" * (3 * 1024 * 1024)})
    async with _asgi() as client:
        response = await client.post(
            "/api/v1/chat/send", content=big, headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert await database_sync_to_async(ChatMessage.objects.count)() == 0


async def test_a_streamed_100_mb_body_is_refused_without_reading_it():
    """The token endpoint needs no login: a 100 MB body of unannounced length is refused once
    the limit is passed, and the rest is never read."""
    sent = 0

    async def body():
        nonlocal sent
        for _ in range(100 * 16):  # 100 MB in 64 KiB chunks
            sent += 1
            yield b"x" * 65536

    async with _asgi() as client:
        response = await client.post(
            "/api/v1/auth/token", content=body(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert sent < 100  # ~2.5 MB read of 100 MB


@pytest.mark.parametrize("raw_id", ["%202", "%D9%A2", "2%20", "+2", "0x2", "1e3", "-1"])
def test_path_ids_are_plain_ascii_digits(api, owner, raw_id):
    ChatSessionFactory(owner=owner)
    ChatSessionFactory(owner=owner)  # ids 1 and 2 exist: only the spelling is wrong
    response = api.get(f"/api/v1/chat/sessions/{raw_id}")
    _json_error(response, 404)


@pytest.mark.parametrize("name", ["a/b", "../x", "a%2Fb", ".hidden", "x" * 300])
def test_entry_names_out_of_the_whitelist_are_a_json_4xx(api, owner, name):
    agent = AgentFactory(owner=owner)
    response = api.get(f"/api/v1/agents/{agent.pk}/memory/entries/{name}")
    assert 400 <= response.status_code < 500, response.status_code
    assert response["Content-Type"].startswith("application/json")


def test_unknown_api_routes_are_a_json_404(api):
    _json_error(api.get("/api/v1/nothing/here"), 404)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/chat/history?session_id={s}&limit=1&limit=2",
        "/api/v1/chat/history?session_id={s}&session_id={s}",
        "/api/v1/chat/sessions?limit=5&limit=5",
        "/api/v1/chat/search?q=hello&q=world",
        "/api/v1/chat/sessions/{s}/export?format=json&format=markdown",
        "/api/v1/agents/{a}/memory/entries?q=a&q=b",
        "/api/v1/agents/{a}/memory/daily?date=2026-01-01&date=2026-01-02",
    ],
)
def test_a_query_parameter_given_twice_is_refused(api, owner, path):
    # Which one would count is a guess (Django reads the last), as for a body's key given
    # twice: a 400, as the contract's strict types say (a probe).
    session, agent = ChatSessionFactory(owner=owner), AgentFactory(owner=owner)
    response = api.get(path.format(s=session.pk, a=agent.pk))
    _json_error(response, 400)
    assert response.json()["error"]["code"] == "invalid"


def test_a_cursor_with_a_space_before_it_is_refused(api, owner):
    """A probe: " <cursor>" was trimmed and read as the cursor."""
    session = ChatSessionFactory(owner=owner)
    for n in range(3):
        ChatMessage.objects.create(session=session, role="user", content=f"m{n}")
    page = api.get("/api/v1/chat/history", {"session_id": session.pk, "limit": 1}).json()
    cursor = page["older_cursor"]
    assert (
        api.get("/api/v1/chat/history", {"session_id": session.pk, "before": cursor}).status_code
        == 200
    )
    for spelled in (f" {cursor}", f"{cursor} ", f"{cursor}\n"):
        response = api.get("/api/v1/chat/history", {"session_id": session.pk, "before": spelled})
        _json_error(response, 400)
