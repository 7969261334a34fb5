"""chat/turn/lease.py: a killed process's replies are known dead within a lease, not after
STALE_STREAMING_SECONDS, and a process that lives keeps its replies alive however quiet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.events import ORIGIN
from chat.models import ChatMessage, GeneratorLease, MessageRole, MessageStatus
from chat.turn.lease import lease_renew
from tests.factories import ChatSessionFactory

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def _crashed_turn(session, *, lease_left: float, quiet: float = 10.0) -> ChatMessage:
    """A reply `streaming` for the process "killed", its last progress save `quiet` seconds
    ago, that process's lease lapsing in `lease_left` seconds (negative: lapsed)."""
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="before")
    reply = ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="half a repl",
        status=MessageStatus.STREAMING,
        generator="killed",
    )
    now = timezone.now()
    ChatMessage.objects.filter(pk=reply.pk).update(updated_at=now - timedelta(seconds=quiet))
    GeneratorLease.objects.update_or_create(
        process="killed", defaults={"expires_at": now + timedelta(seconds=lease_left)}
    )
    return reply


def test_a_session_whose_generating_process_died_takes_a_send_at_once(
    api, owner, fake_llm, settings
):
    settings.CHAT_SEND_QUEUE_SECONDS = 0
    session = ChatSessionFactory(owner=owner)
    orphan = _crashed_turn(session, lease_left=-3)
    fake_llm.script("fresh answer")
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "again"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["assistant_message"]["content"] == "fresh answer"
    orphan.refresh_from_db()
    assert orphan.status == MessageStatus.FAILED and orphan.content == "half a repl"
    assert orphan.metadata["error_code"] == "interrupted"


def test_a_quiet_reply_of_a_live_process_is_still_generating(api, owner, fake_llm, settings):
    """Waiting for its first token, or for a tool: no progress saved, but its process renews
    its lease."""
    settings.CHAT_SEND_QUEUE_SECONDS = 0
    session = ChatSessionFactory(owner=owner)
    reply = _crashed_turn(session, lease_left=5, quiet=60)
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "again"}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "reply_in_progress"
    reply.refresh_from_db()
    assert reply.status == MessageStatus.STREAMING
    assert ChatMessage.objects.filter(pk=reply.pk).replies_live().exists()


def test_a_lapsed_lease_does_not_fail_a_reply_that_just_saved_progress(owner):
    """Its process renews the lease a moment late (a stalled loop): the progress save a
    moment ago shows it alive."""
    session = ChatSessionFactory(owner=owner)
    reply = _crashed_turn(session, lease_left=-1, quiet=1)
    assert ChatMessage.objects.filter(pk=reply.pk).replies_live().exists()
    assert not ChatMessage.objects.filter(pk=reply.pk).replies_stale().exists()


def test_a_reply_renews_its_processes_lease_and_names_it(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    GeneratorLease.objects.filter(process=ORIGIN).delete()
    fake_llm.script("an answer")
    body = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}, format="json"
    ).json()
    assert ChatMessage.objects.get(pk=body["assistant_message"]["id"]).generator == ORIGIN
    lease = GeneratorLease.objects.get(process=ORIGIN)
    assert lease.expires_at > timezone.now()


def test_renewing_a_lease_twice_keeps_one_row():
    lease_renew(process="p1", seconds=5)
    first = GeneratorLease.objects.get(process="p1").expires_at
    lease_renew(process="p1", seconds=50)
    assert GeneratorLease.objects.filter(process="p1").count() == 1
    assert GeneratorLease.objects.get(process="p1").expires_at > first
