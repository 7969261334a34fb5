"""A session deleted while its reply streams (DELETE /api/v1/chat/sessions/{id}): the reply is
stopped first, as a truncation stops it, not left to run to its end under a chat nobody can
see (spending the model, holding one of the user's concurrent replies, failing its final
write with ERRORs). One whose rows go from under it all the same ends quietly."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from chat.models import ChatMessage, ChatSession
from chat.services.sessions import session_delete
from chat.turn.registry import generation_running
from tests.chat.wsclient import loop_left_clean  # noqa: F401 (autouse)
from tests.factories import ChatSessionFactory
from tests.helpers import token_client

pytestmark = pytest.mark.django_db(transaction=True)


def _words(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))  # 20 ms a token below


async def _streaming(owner, fake_llm, *, words: int):
    """A session whose reply is streaming, the stream's response and its client."""
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    fake_llm.script({"content": _words(words), "token_ms": 20})
    client = await database_sync_to_async(token_client)(owner)
    response = await database_sync_to_async(client.post)(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "talk"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    assert response.status_code == 200
    chunks = aiter(response.streaming_content)
    while b"event: delta" not in await anext(chunks):
        pass
    return session, chunks, client


async def _ended(session_id: int) -> None:
    for _ in range(100):
        if generation_running(session_id=session_id) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the reply still runs")


async def test_deleting_a_session_stops_its_reply_first(owner, fake_llm, caplog):
    session, chunks, client = await _streaming(owner, fake_llm, words=400)
    response = await database_sync_to_async(client.delete)(f"/api/v1/chat/sessions/{session.pk}")
    assert response.status_code == 204
    # Stopped before the rows went: nothing runs on for seconds under a deleted chat.
    assert generation_running(session_id=session.pk) is None
    rest = b"".join([chunk async for chunk in chunks])
    assert b"event: done" in rest and b'"cancelled"' in rest
    assert not await database_sync_to_async(ChatSession.objects.filter(pk=session.pk).exists)()
    assert not await database_sync_to_async(
        ChatMessage.objects.filter(session_id=session.pk).exists
    )()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_reply_whose_session_went_from_under_it_ends_quietly(owner, fake_llm, caplog):
    session, chunks, _client = await _streaming(owner, fake_llm, words=40)
    # As when the reply did not stop in time: its rows are deleted while it runs.
    await database_sync_to_async(session_delete)(session=session)
    rest = b"".join([chunk async for chunk in chunks])
    # `done`, with what arrived, and no "the server failed, try again" for a deleted chat.
    assert b"event: done" in rest and b'"cancelled"' in rest and b"event: error" not in rest
    await _ended(session.pk)
    assert "chat_reply_session_deleted" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def _admin(**kwargs: Any) -> Any:
    """A logged-in superuser's client for the admin."""
    from django.test import Client

    from tests.factories import UserFactory

    root = await database_sync_to_async(UserFactory)(is_staff=True, is_superuser=True)
    admin = Client(**kwargs)
    await database_sync_to_async(admin.force_login)(root)
    return admin


async def _stopped_then_deleted(session, chunks, caplog) -> None:
    """The reply was stopped (its stream ended `cancelled`) before its session went."""
    assert generation_running(session_id=session.pk) is None
    rest = b"".join([chunk async for chunk in chunks])
    assert b"event: done" in rest and b'"cancelled"' in rest
    assert not await database_sync_to_async(ChatSession.objects.filter(pk=session.pk).exists)()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "chat_session_delete_cancel" in caplog.text


@pytest.mark.parametrize("how", ["delete_view", "delete_selected"])
async def test_an_operator_deleting_a_session_in_the_admin_stops_its_reply_first(
    owner, fake_llm, caplog, how
):
    session, chunks, _client = await _streaming(owner, fake_llm, words=400)
    if how == "delete_view":
        url = reverse("admin:chat_chatsession_delete", args=[session.pk])
        data = {"post": "yes"}
    else:
        url = reverse("admin:chat_chatsession_changelist")
        data = {"action": "delete_selected", "_selected_action": [session.pk], "post": "yes"}
    response = await database_sync_to_async((await _admin()).post)(url, data)
    assert response.status_code == 302
    await _stopped_then_deleted(session, chunks, caplog)


async def test_an_operator_deleting_a_user_stops_their_replies_first(owner, fake_llm, caplog):
    session, chunks, _client = await _streaming(owner, fake_llm, words=400)
    url = reverse("admin:auth_user_delete", args=[owner.pk])
    response = await database_sync_to_async((await _admin()).post)(url, {"post": "yes"})
    assert response.status_code == 302
    await _stopped_then_deleted(session, chunks, caplog)


async def test_an_admin_delete_without_its_csrf_token_stops_nothing(owner, fake_llm):
    # The reply is stopped before Django's delete view runs: only for a request that view
    # will then carry out.
    session, chunks, _client = await _streaming(owner, fake_llm, words=400)
    admin = await _admin(enforce_csrf_checks=True)
    for url in (
        reverse("admin:chat_chatsession_delete", args=[session.pk]),
        reverse("admin:auth_user_delete", args=[owner.pk]),
    ):
        response = await database_sync_to_async(admin.post)(url, {"post": "yes"})
        assert response.status_code == 403
    assert generation_running(session_id=session.pk) is not None
    assert await database_sync_to_async(ChatSession.objects.filter(pk=session.pk).exists)()
    await database_sync_to_async(session_delete)(session=session)  # end it for the teardown
    b"".join([chunk async for chunk in chunks])


@pytest.mark.parametrize("how", ["delete_view", "delete_selected"])
async def test_an_operator_deleting_a_streaming_reply_stops_it_first(owner, fake_llm, caplog, how):
    session, chunks, _client = await _streaming(owner, fake_llm, words=400)
    reply = await database_sync_to_async(
        ChatMessage.objects.filter(session=session, role="assistant").get
    )()
    if how == "delete_view":
        url = reverse("admin:chat_chatmessage_delete", args=[reply.pk])
        data: dict[str, Any] = {"post": "yes"}
    else:
        url = reverse("admin:chat_chatmessage_changelist")
        data = {"action": "delete_selected", "_selected_action": [reply.pk], "post": "yes"}
    response = await database_sync_to_async((await _admin()).post)(url, data)
    assert response.status_code == 302
    assert generation_running(session_id=session.pk) is None
    rest = b"".join([chunk async for chunk in chunks])
    assert b"event: done" in rest and b'"cancelled"' in rest
    assert not await database_sync_to_async(ChatMessage.objects.filter(pk=reply.pk).exists)()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
