"""cadau/querytext.py: an API query string that is not UTF-8 once its %-escapes are decoded is
a 400 in the API's error shape, before Django would read it as U+FFFD. Before it, `q=%FF`
was searched for as "\ufffd" (200)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async
from rest_framework.authtoken.models import Token

from cadau.asgi import application
from cadau.querytext import query_string_is_utf8
from chat.models import ChatMessage
from tests.factories import ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db(transaction=True)

NOT_UTF8 = ["%FF", "%C3", "%C3%28", "%ED%A0%80", "%F4%90%80%80", "%C0%AF", "a%80b"]


def _client(token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),  # type: ignore[arg-type]
        base_url="http://localhost",
        headers={"Authorization": f"Token {token}"},
    )


def _setup(owner) -> tuple[str, int]:
    session: Any = ChatSessionFactory(owner=owner)
    ChatMessageFactory(session=session, content="a \ufffd in the text")
    return Token.objects.create(user=owner).key, session.pk


def test_the_check_reads_escapes_and_plus_signs():
    assert query_string_is_utf8(b"q=caf%C3%A9&limit=2")
    assert query_string_is_utf8(b"q=%E6%B1%89+%F0%9F%98%80")
    assert query_string_is_utf8(b"")
    for bad in NOT_UTF8:
        assert not query_string_is_utf8(f"q={bad}".encode()), bad
    assert not query_string_is_utf8(b"%FF=x")  # names too


@pytest.mark.parametrize("bad", NOT_UTF8)
async def test_a_search_for_bytes_that_are_not_text_is_a_400(owner, bad):
    token, session_id = await database_sync_to_async(_setup)(owner)
    async with _client(token) as client:
        response = await client.get(f"/api/v1/chat/search?q={bad}")
        assert response.status_code == 400, response.text[:300]
        assert response.json()["error"]["code"] == "bad_request"
        # Any API route, any parameter.
        response = await client.get(f"/api/v1/chat/history?session_id={session_id}&x={bad}")
        assert response.status_code == 400
        # The same text written as UTF-8 is searched.
        response = await client.get("/api/v1/chat/search?q=%EF%BF%BD")
        assert response.status_code == 200
        assert len(response.json()["results"]) == 1


@pytest.mark.parametrize("bad", NOT_UTF8)
async def test_a_path_that_is_not_text_is_a_400(owner, bad):
    """A probe: `/memory/entries/%ff` was refused as the entry name "\ufffd"."""
    token, _ = await database_sync_to_async(_setup)(owner)
    async with _client(token) as client:
        response = await client.get(f"/api/v1/agents/1/memory/entries/{bad}")
        assert response.status_code == 400, response.text[:300]
        assert response.json()["error"]["code"] == "bad_request"
        # Written as UTF-8, it is a name like any other (not found here).
        response = await client.get("/api/v1/agents/1/memory/entries/caf%C3%A9")
        assert response.status_code == 404


async def test_a_json_body_that_is_not_utf8_is_a_400_and_stores_nothing(owner):
    token, session_id = await database_sync_to_async(_setup)(owner)
    body = b'{"session_id": %d, "content": "\xff\xfe"}' % session_id
    async with _client(token) as client:
        response = await client.post(
            "/api/v1/chat/send", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"
    assert await database_sync_to_async(ChatMessage.objects.count)() == 1


async def test_pages_outside_the_api_keep_djangos_reading():
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),
        base_url="http://localhost",
    ) as client:
        response = await client.get("/accounts/login/?next=%FF")
    assert response.status_code == 200
