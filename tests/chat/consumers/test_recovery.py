"""Crash recovery: sweep_streaming marks stale replies failed, and the session then accepts
sends over the consumer again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command
from django.utils import timezone

from chat.models import ChatMessage, MessageRole, MessageStatus
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open
from tests.factories import ChatSessionFactory

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_sweep_streaming_marks_stale_replies_failed_and_leaves_live_ones(owner, capsys):
    session = ChatSessionFactory(owner=owner)
    stale = ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="half", status="streaming"
    )
    live = ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="growing", status="streaming"
    )
    ChatMessage.objects.filter(pk=stale.pk).update(
        updated_at=timezone.now() - timedelta(minutes=10)
    )
    call_command("sweep_streaming")
    stale.refresh_from_db()
    live.refresh_from_db()
    assert stale.status == MessageStatus.FAILED and stale.content == "half"
    assert "interrupted" in stale.metadata["error"]
    assert live.status == MessageStatus.STREAMING
    assert "1 stale" in capsys.readouterr().out


async def test_after_a_sweep_the_session_accepts_sends_again(session, owner_cookie, fake_llm):
    def crashed_turn() -> None:
        ChatMessage.objects.create(session=session, role=MessageRole.USER, content="lost")
        stuck = ChatMessage.objects.create(
            session=session, role=MessageRole.ASSISTANT, content="par", status="streaming"
        )
        ChatMessage.objects.filter(pk=stuck.pk).update(
            updated_at=timezone.now() - timedelta(minutes=10)
        )
        call_command("sweep_streaming")

    await database_sync_to_async(crashed_turn)()
    fake_llm.script("back again")
    ws = await _open(session.pk, owner_cookie)
    assert await ws.receive_nothing(timeout=0.1)  # no live reply to resume
    await ws.send_json_to({"type": "send", "content": "hello?"})
    assert (await _until(ws, "done"))[-1]["message"]["content"] == "back again"
    await ws.disconnect()


async def test_a_socket_is_told_within_seconds_when_the_process_generating_its_reply_dies(
    session, owner_cookie, settings
):
    """kill -9 of the process generating the session's reply: its lease lapses, and a socket
    in another process gets `error` and `done` with the partial text stored `failed`."""
    from chat.models import GeneratorLease

    settings.CHAT_REPLY_LEASE_SECONDS = 2

    def crashed_turn() -> ChatMessage:
        ChatMessage.objects.create(session=session, role=MessageRole.USER, content="lost")
        stuck = ChatMessage.objects.create(
            session=session,
            role=MessageRole.ASSISTANT,
            content="half a repl",
            status="streaming",
            generator="killed",
        )
        GeneratorLease.objects.create(
            process="killed", expires_at=timezone.now() + timedelta(seconds=1)
        )
        return stuck

    stuck = await database_sync_to_async(crashed_turn)()
    ws = await _open(session.pk, owner_cookie)
    resumed = await ws.receive_json_from(timeout=2)  # the reply being generated, as it stood
    assert resumed["type"] == "message" and resumed["message"]["id"] == stuck.pk
    events = await _until(ws, "done", timeout=8)
    assert [e["type"] for e in events] == ["error", "done"]
    assert events[0]["code"] == "interrupted"
    done = events[-1]["message"]
    assert done["status"] == "failed" and done["content"] == "half a repl"
    await ws.disconnect()
