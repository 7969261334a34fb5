"""Per-user limits on the send path (issue 14, item 2): the `chat_send` rate that REST and the
WebSocket share (chat/turn/checks.py, send_rate_check), replies generating at once
(CHAT_MAX_CONCURRENT_REPLIES, chat/turn/rows.py), open sockets (CHAT_MAX_SOCKETS_PER_USER,
chat/services/sockets.py) and frames per socket (WS_MAX_FRAMES_PER_MINUTE, chat/consumers.py).

Each test sets the limit it exercises through the `settings` fixture, whatever the defaults or
the environment say (benchmarks and browser tests turn them all off: bench.procs.NO_LIMITS).
Sockets go through the real ASGI application; replies come from the fake LLM server, paced
(`token_ms`) where they must be streaming at the same time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from cadau import limits
from chat import consumers
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.services import sockets
from tests.chat.wsclient import (
    TIMEOUT,
    closed_with,
    login_cookie,
    loop_left_clean,  # noqa: F401 (autouse)
    socket_for,
    until,
    words,
    ws_open,
)
from tests.factories import ChatSessionFactory, make_conversation

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)

SEND = "/api/v1/chat/send"
REGENERATE = "/api/v1/chat/regenerate"


@pytest.fixture
def clock(monkeypatch):
    """The limiter's clock (cadau.limits._now): a window cannot roll over mid-test."""

    class Clock:
        now = 6_000_000.0  # the start of a minute

        def advance(self, seconds: float) -> None:
            self.now += seconds

    c = Clock()
    monkeypatch.setattr(limits, "_now", lambda: c.now)
    return c


@pytest.fixture
def send_rate(settings):
    def set_rate(value: str) -> None:
        settings.RATE_LIMITS = {**settings.RATE_LIMITS, "chat_send": value}

    return set_rate


def _session(owner: Any) -> ChatSession:
    created: ChatSession = ChatSessionFactory.create(owner=owner)
    return created


new_session = database_sync_to_async(_session)
cookie_of = database_sync_to_async(login_cookie)


def _count(session: ChatSession) -> int:
    return ChatMessage.objects.filter(session_id=session.pk).count()


count_of = database_sync_to_async(_count)


def _post(client: APIClient, path: str, body: dict[str, Any], **extra: Any) -> Any:
    return client.post(path, body, format="json", **extra)


# REST from an async test: the test client runs the async view on a loop of its own.
post = database_sync_to_async(_post, thread_sensitive=False)


def _assert_429(response: Any, code: str) -> int:
    assert response.status_code == 429, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code and body["error"]["message"]
    retry_after = int(response["Retry-After"])
    assert retry_after >= 1
    return retry_after


# --- the chat_send rate -----------------------------------------------------------------------


def test_the_31st_send_in_a_minute_is_refused_over_rest_and_stores_nothing(
    send_rate, clock, api, outsider_api, owner, outsider, fake_llm
):
    send_rate("30/min")
    clock.advance(15)  # 45 s left in this window
    session = _session(owner)
    for n in range(30):
        response = api.post(SEND, {"session_id": session.pk, "content": f"m{n}"}, format="json")
        assert response.status_code == 200, (n, response.content[:300])
    refused = api.post(SEND, {"session_id": session.pk, "content": "one more"}, format="json")
    assert _assert_429(refused, "throttled") == 45
    # Streaming or not, and regenerating: the same budget, refused before anything is stored.
    streamed = api.post(
        SEND,
        {"session_id": session.pk, "content": "one more"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    # (An error before a stream starts is JSON text under the negotiated event-stream type.)
    assert streamed.status_code == 429 and int(streamed["Retry-After"]) >= 1
    assert json.loads(streamed.content)["error"]["code"] == "throttled"
    _assert_429(api.post(REGENERATE, {"session_id": session.pk}, format="json"), "throttled")
    assert _count(session) == 60
    assert fake_llm.count("chat") == 30
    # Another user has an allowance of their own.
    theirs = _session(outsider)
    assert (
        outsider_api.post(SEND, {"session_id": theirs.pk, "content": "hi"}, format="json")
    ).status_code == 200
    # The next window allows again.
    clock.advance(45)
    again = api.post(SEND, {"session_id": session.pk, "content": "later"}, format="json")
    assert again.status_code == 200
    assert _count(session) == 62


def test_regenerates_spend_the_send_budget(send_rate, clock, api, owner, fake_llm):
    send_rate("3/min")
    session = _session(owner)
    make_conversation(session, turns=1)
    for _ in range(3):
        assert api.post(REGENERATE, {"session_id": session.pk}, format="json").status_code == 200
    _assert_429(
        api.post(SEND, {"session_id": session.pk, "content": "now?"}, format="json"), "throttled"
    )
    assert fake_llm.count("chat") == 3


async def test_a_throttled_websocket_send_is_an_error_with_retry_after_and_stores_nothing(
    send_rate, clock, owner, fake_llm
):
    send_rate("3/min")
    clock.advance(50)  # 10 s left
    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    for n in range(3):
        await ws.send_json_to({"type": "send", "content": f"m{n}"})
        await until(ws, "done")
    await ws.send_json_to({"type": "send", "content": "too many", "client_id": "c-4"})
    refused = await ws.receive_json_from(timeout=TIMEOUT)
    assert refused["type"] == "error" and refused["code"] == "throttled" and refused["message"]
    assert refused["retry_after"] == 10
    assert await ws.receive_nothing(timeout=0.2)
    assert await count_of(session) == 6
    assert fake_llm.count("chat") == 3
    # The socket stays open: once the window has passed, it sends again.
    clock.advance(10)
    fake_llm.script("back")
    await ws.send_json_to({"type": "send", "content": "later", "client_id": "c-4"})
    assert (await until(ws, "done"))[-1]["message"]["content"] == "back"
    await ws.disconnect()


async def test_rest_and_websocket_sends_spend_one_budget(send_rate, clock, owner, api, fake_llm):
    send_rate("4/min")
    session = await new_session(owner)
    for n in range(2):
        response = await post(api, SEND, {"session_id": session.pk, "content": f"rest {n}"})
        assert response.status_code == 200
    ws = await ws_open(session.pk, await cookie_of(owner))
    for n in range(2):
        await ws.send_json_to({"type": "send", "content": f"ws {n}"})
        await until(ws, "done")
    await ws.send_json_to({"type": "send", "content": "ws over"})
    refused = await ws.receive_json_from(timeout=TIMEOUT)
    assert refused["code"] == "throttled" and refused["retry_after"] >= 1
    _assert_429(
        await post(api, SEND, {"session_id": session.pk, "content": "rest over"}), "throttled"
    )
    assert await count_of(session) == 8
    await ws.disconnect()


# --- replies generating at once ---------------------------------------------------------------


async def _start_reply(session: ChatSession, cookie: str) -> Any:
    """A socket on `session` whose send's reply is streaming (its first delta arrived)."""
    ws = await ws_open(session.pk, cookie)
    await ws.send_json_to({"type": "send", "content": "talk for a while"})
    await until(ws, "delta")
    return ws


async def test_replies_past_the_cap_are_429_until_one_finishes(
    settings, send_rate, owner, outsider, api, outsider_api, fake_llm
):
    settings.CHAT_MAX_CONCURRENT_REPLIES = 4
    send_rate("off")
    sessions = [await new_session(owner) for _ in range(5)]
    cookie = await cookie_of(owner)
    # Three long replies and one that ends in a few seconds, all streaming at once.
    fake_llm.script(
        *[{"content": words(400), "token_ms": 30}] * 3, {"content": words(100), "token_ms": 30}
    )
    streaming = [await _start_reply(session, cookie) for session in sessions[:4]]
    fifth = sessions[4]
    refused = await post(api, SEND, {"session_id": fifth.pk, "content": "one more"})
    assert _assert_429(refused, "too_many_replies") == 5
    ws = await ws_open(fifth.pk, cookie)
    await ws.send_json_to({"type": "send", "content": "one more"})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "too_many_replies"
    assert event["retry_after"] == 5
    assert await count_of(fifth) == 0
    # Another user is not affected.
    theirs = await new_session(outsider)
    response = await post(outsider_api, SEND, {"session_id": theirs.pk, "content": "hi"})
    assert (
        response.status_code == 200 and response.json()["assistant_message"]["status"] == "complete"
    )
    # When the short reply finishes, its slot frees.
    done = (await until(streaming[3], "done", timeout=15))[-1]
    assert done["message"]["status"] == "complete"
    await ws.send_json_to({"type": "send", "content": "now?"})
    assert (await until(ws, "done"))[-1]["message"]["status"] == "complete"
    assert await count_of(fifth) == 2
    for socket in streaming[:3]:
        await socket.send_json_to({"type": "cancel"})
        assert (await until(socket, "done"))[-1]["message"]["status"] == "cancelled"
    for socket in [*streaming, ws]:
        await socket.disconnect()


async def test_a_regenerate_past_the_cap_is_429_too(settings, send_rate, owner, api, fake_llm):
    settings.CHAT_MAX_CONCURRENT_REPLIES = 1
    send_rate("off")
    busy, other = await new_session(owner), await new_session(owner)
    await database_sync_to_async(make_conversation)(other, turns=1)
    fake_llm.script({"content": words(400), "token_ms": 30})
    ws = await _start_reply(busy, await cookie_of(owner))
    before = await database_sync_to_async(
        lambda: list(
            ChatMessage.objects.filter(session_id=other.pk).values_list("status", "content")
        )
    )()
    refused = await post(api, REGENERATE, {"session_id": other.pk})
    _assert_429(refused, "too_many_replies")
    after = await database_sync_to_async(
        lambda: list(
            ChatMessage.objects.filter(session_id=other.pk).values_list("status", "content")
        )
    )()
    assert after == before  # the old reply is left as it was, not emptied for a new one
    assert fake_llm.count("chat") == 1
    await ws.send_json_to({"type": "cancel"})
    await until(ws, "done")
    # With the slot free the regenerate runs.
    response = await post(api, REGENERATE, {"session_id": other.pk})
    assert response.status_code == 200, response.content[:300]
    assert response.json()["assistant_message"]["status"] == MessageStatus.COMPLETE
    await ws.disconnect()


async def test_no_cap_when_set_to_zero(settings, send_rate, owner, api, fake_llm):
    settings.CHAT_MAX_CONCURRENT_REPLIES = 0
    send_rate("off")
    sessions = [await new_session(owner) for _ in range(3)]
    fake_llm.script(*[{"content": words(400), "token_ms": 30}] * 2)
    cookie = await cookie_of(owner)
    streaming = [await _start_reply(session, cookie) for session in sessions[:2]]
    response = await post(api, SEND, {"session_id": sessions[2].pk, "content": "and me"})
    assert response.status_code == 200
    for socket in streaming:
        await socket.send_json_to({"type": "cancel"})
        await until(socket, "done")
        await socket.disconnect()


# --- open sockets per user --------------------------------------------------------------------


async def _refused_socket(session_id: int, cookie: str) -> tuple[int, list]:
    ws = socket_for(session_id, cookie)
    connected, _ = await ws.connect(timeout=TIMEOUT)
    assert connected  # accepted, to say why, then closed
    code, before = await closed_with(ws)
    await ws.disconnect()
    return code, before


async def test_the_21st_socket_of_a_user_is_closed_4429_with_retry_after(settings, owner, outsider):
    settings.CHAT_MAX_SOCKETS_PER_USER = 20
    first, second = await new_session(owner), await new_session(owner)
    cookie, other_login = await cookie_of(owner), await cookie_of(owner)
    # The cap is per user: over sessions and browser logins alike.
    held = [await ws_open(first.pk, cookie) for _ in range(10)]
    held += [await ws_open(second.pk, other_login) for _ in range(10)]
    code, before = await _refused_socket(first.pk, cookie)
    assert code == consumers.CLOSE_TOO_MANY == 4429
    assert len(before) == 1
    assert before[0]["type"] == "error" and before[0]["code"] == "too_many_sockets"
    assert before[0]["retry_after"] >= 1
    # Another user is not affected.
    theirs = await ws_open((await new_session(outsider)).pk, await cookie_of(outsider))
    # Closing one frees one slot; the refused socket took none.
    await held.pop().disconnect()
    held.append(await ws_open(second.pk, cookie))
    code, _ = await _refused_socket(second.pk, cookie)
    assert code == 4429
    for ws in [*held, theirs]:
        await ws.disconnect()
    assert not [h for h in sockets._open if h.user_id == owner.pk]  # every close unregistered


async def test_no_socket_cap_when_set_to_zero(settings, owner):
    settings.CHAT_MAX_SOCKETS_PER_USER = 0
    session = await new_session(owner)
    cookie = await cookie_of(owner)
    held = [await ws_open(session.pk, cookie) for _ in range(25)]
    for ws in held:
        await ws.disconnect()


# --- frames per socket ------------------------------------------------------------------------


@pytest.fixture
def frame_clock(monkeypatch):
    """The consumer's clock for its frame window: a minute cannot roll over mid-test."""

    class Clock:
        now = 60_000.0

    c = Clock()
    monkeypatch.setattr(consumers, "_monotonic", lambda: c.now)
    return c


async def test_frames_past_the_per_minute_cap_close_the_socket_4429(settings, frame_clock, owner):
    settings.WS_MAX_FRAMES_PER_MINUTE = 120
    session = await new_session(owner)
    cookie = await cookie_of(owner)
    ws = await ws_open(session.pk, cookie)
    for _ in range(120):
        await ws.send_to(text_data='{"type": "dance"}')
        assert (await ws.receive_json_from(timeout=TIMEOUT))["code"] == "bad_request"
    await ws.send_to(text_data='{"type": "dance"}')
    code, before = await closed_with(ws)
    assert code == 4429
    assert [(e["type"], e["code"]) for e in before] == [("error", "throttled")]
    assert before[0]["retry_after"] >= 1
    await ws.disconnect()
    # The count is per socket: another one of the same user starts afresh.
    other = await ws_open(session.pk, cookie)
    await other.send_to(text_data='{"type": "dance"}')
    assert (await other.receive_json_from(timeout=TIMEOUT))["code"] == "bad_request"
    await other.disconnect()


async def test_the_frame_count_starts_again_each_minute(settings, frame_clock, owner):
    settings.WS_MAX_FRAMES_PER_MINUTE = 5
    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    for _ in range(3):
        for _ in range(5):
            await ws.send_to(text_data="[]")
            assert (await ws.receive_json_from(timeout=TIMEOUT))["code"] == "bad_request"
        frame_clock.now += 60
    await ws.disconnect()


async def test_no_frame_cap_when_set_to_zero(settings, frame_clock, owner):
    settings.WS_MAX_FRAMES_PER_MINUTE = 0
    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    for _ in range(200):
        await ws.send_to(text_data="[]")
    for _ in range(200):
        assert (await ws.receive_json_from(timeout=TIMEOUT))["code"] == "bad_request"
    await ws.disconnect()
