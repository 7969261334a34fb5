"""One message shape: the history API and the events carry the same object for a message."""

from __future__ import annotations

import json

import pytest

from chat.api.serializers import MessageSerializer
from chat.models import ChatMessage, MessageRole
from chat.shapes import message_payload
from tests.factories import ChatSessionFactory
from tests.helpers import send_streaming


@pytest.mark.django_db(transaction=True)
def test_history_shows_a_reply_exactly_as_its_events_did(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("Hello there.")
    events = send_streaming(api, session, "hi")
    sent = {e["message"]["id"]: e["message"] for e in events if e["type"] in ("message", "done")}
    history = api.get(f"/api/v1/chat/history?session_id={session.pk}").json()["messages"]
    assert {m["id"]: m for m in history} == sent


@pytest.mark.django_db
def test_every_field_of_every_kind_of_message_is_the_same(owner):
    session = ChatSessionFactory(owner=owner)
    call = [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
    rows = [
        ChatMessage.objects.create(
            session=session, role=MessageRole.USER, content="q", client_id="k"
        ),
        ChatMessage.objects.create(
            session=session, role=MessageRole.ASSISTANT, content="", tool_calls=call
        ),
        ChatMessage.objects.create(
            session=session, role=MessageRole.TOOL, content="12:00", tool_call_id="c1"
        ),
        ChatMessage.objects.create(
            session=session, role=MessageRole.ASSISTANT, content="noon", metadata={"rounds": 2}
        ),
    ]
    for row in rows:
        # Through JSON, as a client receives both.
        serialized = json.loads(json.dumps(MessageSerializer(row).data))
        assert serialized == json.loads(json.dumps(message_payload(row)))
    assert message_payload(rows[0])["tool_call_id"] is None
    assert message_payload(rows[2])["tool_call_id"] == "c1"
