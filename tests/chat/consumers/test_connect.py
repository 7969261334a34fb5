"""The consumer's connection through the real ASGI application: the handshake (origin
check, Django session auth, routing), what a connect and a disconnect leave behind, and the
server's own send handed to WebSockets."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as settings_module

from cadau.asgi import application
from chat import events
from chat.models import ChatSession
from chat.search.archive_window import archive_window_ready
from devtools.introspect import background_wait
from tests.chat.consumers.helpers import (
    ORIGIN,
    TIMEOUT,
    cookie_for,
    socket_to,
)
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open
from tests.factories import ChatSessionFactory, UserFactory, make_conversation

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


async def test_unauthenticated_socket_is_refused_at_the_handshake(session):
    connected, code = await socket_to(session.pk, cookie=None).connect(timeout=TIMEOUT)
    assert not connected and code == 4401


async def test_foreign_origin_is_refused(session, owner_cookie):
    ws = socket_to(session.pk, cookie=owner_cookie, origin=b"http://evil.example")
    connected, _code = await ws.connect(timeout=TIMEOUT)
    assert not connected


async def test_missing_origin_header_is_refused(session, owner_cookie):
    connected, _ = await socket_to(session.pk, cookie=owner_cookie, origin=None).connect(
        timeout=TIMEOUT
    )
    assert not connected


@pytest.mark.parametrize(
    "path", ["/ws/chat/1", "/ws/chat/1/x/", "/ws/", "/ws/nope/", "/", "/api/v1/status"]
)
async def test_a_path_with_no_route_is_refused_like_a_missing_session(path, caplog):
    """Channels' router raised ValueError for these, which Daphne answered with a 500 and an
    ERROR traceback: a handshake anyone can send, logged in or not."""
    headers = [(b"host", b"localhost"), (b"origin", ORIGIN)]
    connected, code = await WebsocketCommunicator(application, path, headers=headers).connect(
        timeout=TIMEOUT
    )
    assert not connected and code == 4404
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_another_users_session_is_refused_like_a_missing_one(session):
    outsider = await database_sync_to_async(UserFactory)(username="outsider")
    cookie = await database_sync_to_async(cookie_for)(outsider)
    foreign = await socket_to(session.pk, cookie=cookie).connect(timeout=TIMEOUT)
    missing = await socket_to(session.pk + 10_000, cookie=cookie).connect(timeout=TIMEOUT)
    malformed = await socket_to("abc", cookie=cookie).connect(timeout=TIMEOUT)
    assert foreign == missing == malformed == (False, 4404)


async def test_disconnected_socket_leaves_the_local_registry(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    assert len(events._local.get(session.pk, ())) == 1
    await ws.disconnect()
    assert session.pk not in events._local


async def test_connect_without_a_live_reply_sends_nothing(session, owner_cookie):
    ws = await _open(session.pk, owner_cookie)
    assert await ws.receive_nothing(timeout=0.2)
    await ws.disconnect()


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


@pytest.mark.skipif(not settings_module.REDIS_URL, reason="needs REDIS_URL (the Redis layer)")
async def test_a_closed_sockets_consumer_ends_without_cancelling_its_redis_read(
    session, owner_cookie
):
    """A consumer stops by ending its own channel read with a message: a channels-redis read
    cancelled mid-BZPOPMIN could stay cancelling for good, polling Redis, and the consumer
    never ended (a CI run hung on it in tests/test_origin.py). Sockets refused by the consumer
    and sockets closed by their client both end within a second, every time."""
    for _ in range(10):
        refused = socket_to(session.pk, cookie=None)
        connected, code = await refused.connect(timeout=TIMEOUT)
        assert not connected and code == 4401
        await asyncio.wait_for(asyncio.shield(refused.future), 1.0)
        ws = await _open(session.pk, owner_cookie)
        await ws.disconnect()
        await asyncio.wait_for(asyncio.shield(ws.future), 1.0)


async def test_a_socket_opened_on_a_long_chat_has_its_recall_window_read(
    owner, owner_cookie, settings
):
    """The chat is open: its next send will recall from the archive's newest rows, read now in
    the background (chat/search/recall_warm.py) instead of before that send's first token."""
    settings.CHAT_CONTEXT_RECALL = True
    session = await database_sync_to_async(_summarised)(owner)
    ws = await _open(session.pk, owner_cookie)
    await database_sync_to_async(background_wait)()
    assert archive_window_ready(
        owner_id=owner.pk,
        session_id=session.pk,
        version=session.messages_version,
        below_id=session.verbatim_since_message_id,
    )
    await ws.disconnect()


def _summarised(owner) -> ChatSession:
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    rows = make_conversation(session, turns=60)
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary="## Facts and decisions\n- Questions were asked.",
        verbatim_since_message_id=rows[60].pk,
    )
    session.refresh_from_db()
    return session
