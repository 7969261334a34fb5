"""The consumer's send path, with the real fake LLM server streaming replies: the events
of a turn, frame validation, repeated client ids, several sockets on one session, a REST send
seen on the socket, compaction events."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from cadau.contextconfig import ContextConfig
from chat import events
from chat.context import context_budget_from_db
from chat.models import ChatSession, MessageRole, MessageStatus
from tests.chat.consumers.helpers import (
    TIMEOUT,
    delta_text,
    messages_of,
)
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open
from tests.factories import make_conversation
from tests.fixtures_llm import summary_of

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


async def test_send_streams_message_deltas_and_done_with_budget(session, owner_cookie, fake_llm):
    fake_llm.script("one two three")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "hello", "client_id": "c-1"})
    events = await _until(ws, "done")
    await ws.disconnect()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message" and kinds[-1] == "done" and "delta" in kinds
    user = events[0]["message"]
    assert user["role"] == "user" and user["content"] == "hello" and user["client_id"] == "c-1"
    deltas = [e for e in events if e["type"] == "delta"]
    assert delta_text(events) == "one two three"
    assert [d["offset"] for d in deltas] == [
        sum(len(d["text"]) for d in deltas[:i]) for i in range(len(deltas))
    ]
    # The fake server stamps every chunk; the delta passes the stamp on.
    assert all(isinstance(d["emitted_at"], float) for d in deltas)
    done = events[-1]
    assert done["message"]["status"] == "complete"
    assert done["message"]["content"] == "one two three"
    # Worked out without reading back (chat/services/reply.py, _finish): as a fresh read.
    assert done["context_budget"] == await database_sync_to_async(context_budget_from_db)(
        session_id=session.pk
    )
    assert done["context_budget"]["used_runes"] > 0
    stored = await messages_of(session.pk)
    assert [(m.role, m.status, m.content) for m in stored] == [
        (MessageRole.USER, MessageStatus.COMPLETE, "hello"),
        (MessageRole.ASSISTANT, MessageStatus.COMPLETE, "one two three"),
    ]


@pytest.mark.parametrize(
    ("frame", "what"),
    [
        ("not json", "not valid JSON"),
        # Not JSON, though Python's decoder takes them: refused as the REST API refuses them.
        ('{"type": "send", "content": "x", "x": NaN}', "not valid JSON"),
        ('{"type": "send", "content": "x", "x": -Infinity}', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "dance"}', "Unknown frame type"),
        ('{"content": "x"}', "Unknown frame type"),
        ('{"type": "send", "content": 5}', "content must be a string"),
        ('{"type": "send"}', "content must be a string"),
        ('{"type": "send", "content": "x", "client_id": 7}', "client_id must be a string"),
    ],
)
async def test_malformed_frames_get_bad_request_and_the_socket_stays_open(
    session, owner_cookie, fake_llm, frame, what
):
    ws = await _open(session.pk, owner_cookie)
    await ws.send_to(text_data=frame)
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "bad_request"
    assert what in event["message"]
    # Still open and working.
    fake_llm.script("fine")
    await ws.send_json_to({"type": "send", "content": "still there?"})
    assert (await _until(ws, "done"))[-1]["message"]["content"] == "fine"
    await ws.disconnect()


async def test_binary_frames_get_bad_request(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    await ws.send_to(bytes_data=b"\x00\x01")
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["code"] == "bad_request"
    await ws.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"type": "send", "content": "   "}, "invalid"),
        ({"type": "send", "content": "x" * 200_001}, "message_too_large"),
        ({"type": "send", "content": "x", "client_id": "c" * 65}, "bad_request"),
    ],
)
async def test_send_is_validated_like_rest(session, owner_cookie, fake_llm, frame, code):
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to(frame)
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == code
    await ws.disconnect()
    assert await messages_of(session.pk) == []
    assert fake_llm.count("chat") == 0


async def test_message_too_large_for_the_context_is_refused(session, owner_cookie, settings):
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=2000, hard_limit_runes=2000)
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "y" * 5000})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "message_too_large"
    await ws.disconnect()


async def test_session_deleted_after_connect_is_not_found(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    await database_sync_to_async(ChatSession.objects.filter(pk=session.pk).delete)()
    await ws.send_json_to({"type": "send", "content": "anyone?"})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event == {"type": "error", "code": "not_found", "message": "Not found."}
    await ws.disconnect()


async def test_same_client_id_twice_generates_once_and_answers_only_the_sender(
    session, owner_cookie, fake_llm
):
    fake_llm.script("only once")
    ws = await _open(session.pk, owner_cookie)
    other = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "hi", "client_id": "same"})
    first = await _until(ws, "done")
    await _until(other, "done")
    await ws.send_json_to({"type": "send", "content": "hi", "client_id": "same"})
    repeat = await _until(ws, "done")
    assert [e["type"] for e in repeat] == ["message", "done"]
    assert repeat[0]["message"]["id"] == first[0]["message"]["id"]
    assert repeat[1]["message"]["id"] == first[-1]["message"]["id"]
    assert repeat[1]["message"]["content"] == "only once"
    assert "context_budget" in repeat[1]
    # The repeat went to the sender only.
    assert await other.receive_nothing(timeout=0.3)
    assert fake_llm.count("chat") == 1
    assert len(await messages_of(session.pk)) == 2
    await ws.disconnect()
    await other.disconnect()


async def test_two_sockets_on_one_session_see_the_same_events(session, owner_cookie, fake_llm):
    fake_llm.script("shared words here")
    a = await _open(session.pk, owner_cookie)
    b = await _open(session.pk, owner_cookie)
    await a.send_json_to({"type": "send", "content": "both of you"})
    seen_a, seen_b = await _until(a, "done"), await _until(b, "done")
    # A socket that falls behind gets consecutive deltas merged (the contract allows it), so
    # compare them merged: the same events, whatever the chunking the load made.
    assert events.deltas_merged(seen_a) == events.deltas_merged(seen_b)
    assert delta_text(seen_b) == "shared words here"
    await a.disconnect()
    await b.disconnect()


async def test_a_send_over_rest_streams_to_the_socket(session, owner_cookie, fake_llm):
    fake_llm.script("from rest")
    ws = await _open(session.pk, owner_cookie)

    def rest_send() -> int:
        client = Client()
        client.cookies["sessionid"] = owner_cookie
        r = client.post(
            "/api/v1/chat/send",
            {"session_id": session.pk, "content": "via rest"},
            content_type="application/json",
            HTTP_ORIGIN="http://localhost",
        )
        return r.status_code

    status = await database_sync_to_async(rest_send, thread_sensitive=False)()
    assert status == 200
    events = await _until(ws, "done")
    assert events[0]["message"]["content"] == "via rest"
    assert delta_text(events) == "from rest"
    await ws.disconnect()


async def test_compaction_events_reach_the_socket(session, owner_cookie, fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=3000,
        threshold_pct=80,
        target_pct=50,
        summary_max_runes=500,
        min_verbatim=2,
    )
    await database_sync_to_async(make_conversation)(session, turns=12, words=30)
    fake_llm.script_summary(summary_of("rolled up"))
    fake_llm.script("after the summary")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "and now?"})
    events = await _until(ws, "done", timeout=10)
    states = [e["state"] for e in events if e["type"] == "compaction"]
    assert states == ["started", "done"]
    assert events[-1]["message"]["content"] == "after the summary"
    await ws.disconnect()
