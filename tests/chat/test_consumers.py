"""The WebSocket consumer through the real ASGI application (origin check, Django session auth,
routing), with the real fake LLM server streaming replies. Runs on whatever channel layer the
settings give: in-memory by default, channels-redis when REDIS_URL is set."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as settings_module
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from cadau.asgi import application
from cadau.contextconfig import ContextConfig
from chat import events
from chat.context import context_budget_from_db
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.turn import registry, service
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open
from tests.factories import ChatSessionFactory, UserFactory, make_conversation

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://localhost"
TIMEOUT = 5.0


# Autouse where it is imported: replies finish, and each test gets its own channel layer.
loop_left_clean = _loop_left_clean


def _cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture
def owner_cookie(owner) -> str:
    return _cookie_for(owner)


@pytest.fixture
def session(owner) -> ChatSession:
    created: ChatSession = ChatSessionFactory.create(owner=owner)
    return created


def _socket(
    session_id: Any, *, cookie: str | None, origin: bytes | None = ORIGIN
) -> WebsocketCommunicator:
    # A browser always sends Host; the Origin check compares the Origin with it.
    headers = [(b"host", b"localhost")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/chat/{session_id}/", headers=headers)


async def _settle() -> None:
    """Wait for replies started by sockets (they outlive the socket on purpose)."""
    if service._tasks:
        await asyncio.wait_for(
            asyncio.gather(*list(service._tasks), return_exceptions=True), TIMEOUT
        )


def _messages(session_id: int) -> list[ChatMessage]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id"))


messages_of = database_sync_to_async(_messages)


def _text(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


# --- handshake -------------------------------------------------------------------------------


async def test_unauthenticated_socket_is_refused_at_the_handshake(session):
    connected, code = await _socket(session.pk, cookie=None).connect(timeout=TIMEOUT)
    assert not connected and code == 4401


async def test_foreign_origin_is_refused(session, owner_cookie):
    ws = _socket(session.pk, cookie=owner_cookie, origin=b"http://evil.example")
    connected, _code = await ws.connect(timeout=TIMEOUT)
    assert not connected


async def test_missing_origin_header_is_refused(session, owner_cookie):
    connected, _ = await _socket(session.pk, cookie=owner_cookie, origin=None).connect(
        timeout=TIMEOUT
    )
    assert not connected


async def test_another_users_session_is_refused_like_a_missing_one(session):
    outsider = await database_sync_to_async(UserFactory)(username="outsider")
    cookie = await database_sync_to_async(_cookie_for)(outsider)
    foreign = await _socket(session.pk, cookie=cookie).connect(timeout=TIMEOUT)
    missing = await _socket(session.pk + 10_000, cookie=cookie).connect(timeout=TIMEOUT)
    malformed = await _socket("abc", cookie=cookie).connect(timeout=TIMEOUT)
    assert foreign == missing == malformed == (False, 4404)


# --- the send path ---------------------------------------------------------------------------


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
    assert _text(events) == "one two three"
    assert [d["offset"] for d in deltas] == [
        sum(len(d["text"]) for d in deltas[:i]) for i in range(len(deltas))
    ]
    # The fake server stamps every chunk; the delta passes the stamp on.
    assert all(isinstance(d["emitted_at"], float) for d in deltas)
    done = events[-1]
    assert done["message"]["status"] == "complete"
    assert done["message"]["content"] == "one two three"
    # Worked out without reading back (chat/turn/generate.py `_finish`, chat/context/state.py
    # `context_state_after_reply`): as a fresh read.
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
    assert _text(seen_b) == "shared words here"
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
    assert _text(events) == "from rest"
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
    fake_llm.script_summary("rolled up")
    fake_llm.script("after the summary")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "and now?"})
    events = await _until(ws, "done", timeout=10)
    states = [e["state"] for e in events if e["type"] == "compaction"]
    assert states == ["started", "done"]
    assert events[-1]["message"]["content"] == "after the summary"
    await ws.disconnect()


# --- cancel, disconnect, failure -------------------------------------------------------------


async def test_cancel_stops_within_200ms_and_stores_the_partial_as_cancelled(
    session, owner_cookie, fake_llm
):
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "talk slowly"})
    before = await _until(ws, "delta")
    for _ in range(3):
        before.append(await ws.receive_json_from(timeout=TIMEOUT))
    sent_at = time.monotonic()
    await ws.send_json_to({"type": "cancel"})
    after = await _until(ws, "done")
    elapsed_ms = (time.monotonic() - sent_at) * 1000
    assert elapsed_ms < 200, elapsed_ms
    done = after[-1]
    assert done["message"]["status"] == "cancelled"
    streamed = _text(before + after)
    assert done["message"]["content"] == streamed and streamed.startswith("w0 w1 w2")
    stored = (await messages_of(session.pk))[-1]
    assert stored.status == MessageStatus.CANCELLED and stored.content == streamed
    await ws.disconnect()
    await _settle()
    assert registry.generation_running(session_id=session.pk) is None


async def test_cancel_from_another_socket_stops_the_reply(session, owner_cookie, fake_llm):
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40})
    sender = await _open(session.pk, owner_cookie)
    await sender.send_json_to({"type": "send", "content": "go"})
    await _until(sender, "delta")
    await sender.disconnect()
    stopper = await _open(session.pk, owner_cookie)
    await stopper.send_json_to({"type": "cancel"})
    done = (await _until(stopper, "done"))[-1]
    assert done["message"]["status"] == "cancelled"
    await stopper.disconnect()
    await _settle()


async def test_cancel_with_nothing_running_is_an_error_event(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "cancel"})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "nothing_to_cancel"
    await ws.disconnect()


async def test_disconnect_mid_stream_still_stores_the_whole_reply(session, owner_cookie, fake_llm):
    words = " ".join(f"w{i}" for i in range(30))
    fake_llm.script({"content": words, "token_ms": 10})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "go on without me"})
    await _until(ws, "delta")
    await ws.disconnect()
    await _settle()
    stored = (await messages_of(session.pk))[-1]
    assert stored.status == MessageStatus.COMPLETE and stored.content == words


async def test_reconnect_mid_stream_resumes_from_the_partial(session, owner_cookie, fake_llm):
    words = " ".join(f"w{i}" for i in range(40))
    fake_llm.script({"content": words, "token_ms": 15})
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "resume me"})
    await _until(ws, "delta")
    await ws.disconnect()
    await asyncio.sleep(0.15)
    again = await _open(session.pk, owner_cookie)
    first = await again.receive_json_from(timeout=TIMEOUT)
    assert first["type"] == "message"
    partial = first["message"]
    assert partial["role"] == "assistant" and partial["status"] == "streaming"
    assert partial["content"].startswith("w0 w1")
    rest = await _until(again, "done")
    # The partial plus what follows is the reply, with no piece twice.
    assert partial["content"] + _text(rest) == words == rest[-1]["message"]["content"]
    await again.disconnect()


# --- how events reach the socket (chat/events.py) -------------------------------------


async def test_a_piece_the_socket_already_holds_is_cut_off(session, owner_cookie):
    """A catch-up from another process repeats the text so far at offset 0: the socket sends on
    only what its client lacks, so the client never shows a piece twice."""
    ws = await _open(session.pk, owner_cookie)
    for event in (
        {"type": "delta", "message_id": 7, "text": "Hello ", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "Hello world", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "Hello", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "!", "offset": 11},
    ):
        await events.event_publish_async(session_id=session.pk, event=event)
    got = [await ws.receive_json_from(timeout=TIMEOUT) for _ in range(3)]
    assert [(e["offset"], e["text"]) for e in got] == [(0, "Hello "), (6, "world"), (11, "!")]
    assert await ws.receive_nothing(timeout=0.1)
    await ws.disconnect()


async def test_layer_messages_of_this_process_are_skipped_and_others_forwarded(
    session, owner_cookie
):
    """This process's events reach its sockets directly; the same event coming back through a
    shared layer must not be sent twice. Events of other processes are forwarded."""
    ws = await _open(session.pk, owner_cookie)
    layer = get_channel_layer()
    group = events.session_group(session.pk)
    mine = {"type": "compaction", "state": "started"}
    theirs = {"type": "compaction", "state": "done"}
    await layer.group_send(group, {"type": "chat.event", "event": mine, "origin": events.ORIGIN})
    await layer.group_send(group, {"type": "chat.event", "event": theirs, "origin": "elsewhere"})
    assert await ws.receive_json_from(timeout=TIMEOUT) == theirs
    assert await ws.receive_nothing(timeout=0.1)
    await ws.disconnect()


async def test_a_client_too_slow_for_its_events_is_closed_4408(session, owner_cookie, monkeypatch):
    monkeypatch.setattr(events, "OUTBOX_LIMIT", 5)
    ws = await _open(session.pk, owner_cookie)
    for i in range(10):  # queued without yielding: more than the socket could send meanwhile
        events.event_publish_local(
            session_id=session.pk,
            event={"type": "delta", "message_id": 1, "text": "x", "offset": i},
        )
    closed = None
    while closed is None:
        output = await ws.receive_output(timeout=TIMEOUT)
        if output["type"] == "websocket.close":
            closed = output
    assert closed["code"] == 4408
    await ws.disconnect()


async def test_disconnected_socket_leaves_the_local_registry(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    assert len(events._local.get(session.pk, ())) == 1
    await ws.disconnect()
    assert session.pk not in events._local


async def test_connect_without_a_live_reply_sends_nothing(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    assert await ws.receive_nothing(timeout=0.2)
    await ws.disconnect()


async def test_upstream_cut_stores_the_partial_as_failed(session, owner_cookie, fake_llm):
    fake_llm.script("alpha beta gamma delta epsilon")
    fake_llm.fail_next("cut", after_tokens=2, target="chat")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "break please"})
    events = await _until(ws, "done")
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "done"]
    assert events[-2]["code"] == "llm_stream_cut"
    done = events[-1]["message"]
    assert done["status"] == "failed" and done["content"] == "alpha beta "
    assert done["content"] == _text(events)
    stored = (await messages_of(session.pk))[-1]
    assert (
        stored.status == MessageStatus.FAILED and stored.metadata["error_code"] == "llm_stream_cut"
    )
    await ws.disconnect()


async def test_llm_error_before_any_token_is_error_then_done(session, owner_cookie, fake_llm):
    fake_llm.fail_next("500", times=5, target="chat")
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "fail"})
    events = await _until(ws, "done")
    assert [e["type"] for e in events][-2:] == ["error", "done"]
    assert events[-2]["code"] == "llm_error"
    assert events[-1]["message"]["status"] == "failed"
    await ws.disconnect()


# --- one reply at a time ---------------------------------------------------------------------


async def test_concurrent_sends_queue_and_never_interleave(session, owner_cookie, fake_llm):
    fake_llm.script(
        {"content": "first reply words", "token_ms": 15},
        {"content": "second reply words", "token_ms": 15},
    )
    a = await _open(session.pk, owner_cookie)
    b = await _open(session.pk, owner_cookie)
    watcher = await _open(session.pk, owner_cookie)
    await a.send_json_to({"type": "send", "content": "one"})
    await _until(watcher, "delta")
    await b.send_json_to({"type": "send", "content": "two"})
    events = await _until(watcher, "done")
    events += await _until(watcher, "done")
    # Each reply's deltas sit between its user message and its done, never mixed.
    order = [(e["type"], e.get("message_id") or e.get("message", {}).get("id")) for e in events]
    dones = [i for i, (kind, _) in enumerate(order) if kind == "done"]
    first_id, second_id = events[dones[0]]["message"]["id"], events[dones[1]]["message"]["id"]
    assert all(mid == first_id for kind, mid in order[: dones[0]] if kind == "delta")
    assert all(mid == second_id for kind, mid in order[dones[0] :] if kind == "delta")
    assert events[dones[0]]["message"]["content"] == "first reply words"
    assert events[dones[1]]["message"]["content"] == "second reply words"
    stored = await messages_of(session.pk)
    assert [m.content for m in stored] == ["one", "first reply words", "two", "second reply words"]
    for ws in (a, b, watcher):
        await ws.disconnect()


async def test_send_refused_with_reply_in_progress_when_the_queue_wait_ends(
    session, owner_cookie, fake_llm, settings
):
    settings.CHAT_SEND_QUEUE_SECONDS = 0.2
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(40)), "token_ms": 20})
    a = await _open(session.pk, owner_cookie)
    b = await _open(session.pk, owner_cookie)
    await a.send_json_to({"type": "send", "content": "long one"})
    await _until(b, "delta")
    await b.send_json_to({"type": "send", "content": "me too"})
    refused = await _until(b, "error")
    assert refused[-1]["code"] == "reply_in_progress"
    await _until(a, "done")
    stored = await messages_of(session.pk)
    assert [m.content for m in stored if m.role == MessageRole.USER] == ["long one"]
    for ws in (a, b):
        await ws.disconnect()


async def test_a_second_send_on_the_same_socket_while_queued_is_refused(
    session, owner_cookie, fake_llm
):
    fake_llm.script(
        {"content": " ".join(f"w{i}" for i in range(15)), "token_ms": 15}, "second", "third"
    )
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "one"})
    await _until(ws, "delta")
    await ws.send_json_to({"type": "send", "content": "two"})  # queued behind "one"
    await asyncio.sleep(0.05)
    await ws.send_json_to({"type": "send", "content": "three"})  # refused: one queued already
    events = await _until(ws, "error")
    assert events[-1]["code"] == "reply_in_progress"
    await _until(ws, "done")
    await _until(ws, "done")  # "two" ran after "one"
    await ws.disconnect()
    stored = await messages_of(session.pk)
    assert [m.content for m in stored if m.role == MessageRole.USER] == ["one", "two"]


# --- crash recovery --------------------------------------------------------------------------


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


@pytest.fixture
def agent_session(owner, settings, tmp_path) -> ChatSession:
    from tests.factories import AgentFactory

    settings.RUNTIME_DIR = tmp_path / "runtime"
    settings.AGENT_MEMORY_STORAGE = ""
    agent = AgentFactory.create(owner=owner, config_json={"tools": ["current_time"]})
    return ChatSessionFactory.create(owner=owner, agent=agent)


async def test_cancel_in_a_later_tool_round_finishes_the_row_being_written(
    agent_session, owner_cookie, fake_llm
):
    fake_llm.script(
        {"content": "", "tool_calls": [{"id": "t1", "name": "current_time", "arguments": {}}]},
        {"content": " ".join(f"w{i}" for i in range(200)), "token_ms": 40},
    )
    ws = await _open(agent_session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "what time is it, slowly"})
    before = await _until(ws, "tool_result")
    before += await _until(ws, "delta")
    await ws.send_json_to({"type": "cancel"})
    done = (await _until(ws, "done"))[-1]
    rows = await messages_of(agent_session.pk)
    final = rows[-1]
    # done names the second round's row (not the tool-call row), stored as cancelled
    assert done["message"]["id"] == final.pk
    assert final.role == MessageRole.ASSISTANT and final.status == MessageStatus.CANCELLED
    assert [r.role for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[1].tool_calls and rows[1].status == MessageStatus.COMPLETE
    await ws.disconnect()
    await _settle()


async def test_the_asgi_app_hands_websockets_the_servers_own_send(monkeypatch):
    """Session events skip the middlewares' send wrappers (ChatConsumer.connect): the ASGI
    entry point passes the server's send on in the scope, for WebSockets only."""
    import cadau.asgi
    from chat.consumers import SERVER_SEND

    seen: list[dict] = []

    async def router(scope, receive, send):
        seen.append(scope)

    async def server_send(message):
        pass

    monkeypatch.setattr(cadau.asgi, "router", router)
    await cadau.asgi.application({"type": "websocket", "path": "/ws/"}, None, server_send)
    await cadau.asgi.application({"type": "http", "path": "/"}, None, server_send)
    assert seen[0][SERVER_SEND] is server_send
    assert SERVER_SEND not in seen[1]


async def test_client_frames_and_disconnects_skip_the_connection_hygiene_hop(
    session, owner_cookie, monkeypatch
):
    """Channels hops to its one sync thread to close old connections before every handler;
    this consumer's ORM work does that itself, so only the connect keeps the hop (sends and
    closes arrive 200 at a time in the benchmark)."""
    import channels.consumer
    import channels.generic.websocket

    hops: list[str] = []

    async def counted() -> None:
        hops.append("hop")

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    monkeypatch.setattr(channels.generic.websocket, "aclose_old_connections", counted)
    ws = await _open(session.pk, owner_cookie)
    assert hops == ["hop"]  # the connect
    await ws.send_to(text_data="not json")
    assert (await ws.receive_json_from(timeout=TIMEOUT))["code"] == "bad_request"
    await ws.disconnect()
    assert hops == ["hop"]
    assert session.pk not in events._local


@pytest.mark.skipif(not settings_module.REDIS_URL, reason="needs REDIS_URL (the Redis layer)")
async def test_an_idle_socket_outlives_the_redis_clients_read_timeout(
    session, owner_cookie, fake_llm
):
    """A socket's receive blocks on Redis up to 5 s; redis-py 8 read with a 5 s timeout by
    default and every socket idle that long died ("Timeout reading from"). Idle 7 s, then
    a send is still answered."""
    ws = await _open(session.pk, owner_cookie)
    assert await ws.receive_nothing(timeout=7.0)
    fake_llm.script("still here")
    await ws.send_json_to({"type": "send", "content": "hello?"})
    events = await _until(ws, "done", timeout=10)
    assert events[-1]["message"]["content"] == "still here"
    await ws.disconnect()
