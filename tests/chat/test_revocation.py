"""Open WebSockets end with the credentials that opened them (issue 14, item 3).

`credentials_revoked` (cadau/accounts.py) is sent on a logout, a password change (however it
is made) and a deactivation; chat/services/sockets.py closes the sockets of that browser login
(logout) or of every login of the user (password, deactivation) with 4401: in this process
through its register, in others through the channel layer (each socket is in its user's and
its login's group). A frame that reaches a revoked socket is dropped, and a send it had queued
is abandoned. Independently of the close, `session_for_user` refuses an inactive owner, so a
deactivation the signals did not see (a queryset update) still stops sends.

Sockets go through the real ASGI application, on whatever channel layer the settings give
(in-memory; channels-redis when REDIS_URL is set). The last test runs two Daphne processes
on PostgreSQL and Redis and revokes from this one."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from chat import consumers
from chat.events import layer_is_shared
from chat.models import ChatMessage, ChatSession
from chat.services.sockets import login_group, user_group
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
from tests.factories import ChatSessionFactory, UserFactory

# Sockets and replies work in other threads, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-for-tests-1"  # UserFactory's
NEW_PASSWORD = "a-new-pw-for-tests-42"
SESSIONS = "/api/v1/chat/sessions"
REVOKED = consumers.CLOSE_UNAUTHENTICATED


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def in_thread(fn: Any) -> Any:
    """Sync work (the Django test client, the ORM) from an async test, off the loop."""
    return database_sync_to_async(fn, thread_sensitive=False)


def _session(owner: Any) -> ChatSession:
    created: ChatSession = ChatSessionFactory.create(owner=owner)
    return created


def _count(session: ChatSession) -> int:
    return ChatMessage.objects.filter(session_id=session.pk).count()


new_session = in_thread(_session)
cookie_of = in_thread(login_cookie)
count_of = in_thread(_count)


def _browser(cookie: str) -> Client:
    client = Client()
    client.cookies["sessionid"] = cookie
    return client


def _logout(cookie: str) -> None:
    response = _browser(cookie).post("/accounts/logout/")
    assert response.status_code == 302, response.content[:300]


def _change_own_password(cookie: str) -> None:
    """The real password change view (the admin's, for a staff user's own password)."""
    response = _browser(cookie).post(
        "/admin/password_change/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert response.status_code == 302, response.content[:2000]


def _admin_sets_password(user_id: int) -> None:
    root = get_user_model().objects.get_or_create(
        username="root", defaults={"is_staff": True, "is_superuser": True}
    )[0]
    client = Client()
    client.force_login(root)
    response = client.post(
        f"/admin/auth/user/{user_id}/password/",
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"},
    )
    assert response.status_code == 302, response.content[:2000]


def _set_password_and_save(user_id: int) -> None:
    user = get_user_model().objects.get(pk=user_id)
    user.set_password(NEW_PASSWORD)
    user.save()


def _deactivate(user_id: int) -> None:
    user = get_user_model().objects.get(pk=user_id)
    user.is_active = False
    user.save()


def _token(user: Any) -> str:
    return str(Token.objects.create(user=user).key)


def _api_status(token: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return int(client.get(SESSIONS).status_code)


async def assert_revoked(ws: Any, session: ChatSession, fake_llm: Any) -> None:
    """The socket is closed with 4401; a send that still reaches it is neither stored nor
    answered (a frame in flight when the revocation arrives)."""
    code, _ = await closed_with(ws)
    assert code == REVOKED
    stored, calls = await count_of(session), fake_llm.count("chat")
    await ws.send_json_to({"type": "send", "content": "still me?"})
    assert await ws.receive_nothing(timeout=0.3)
    await asyncio.sleep(0.2)
    assert await count_of(session) == stored
    assert fake_llm.count("chat") == calls
    await ws.disconnect()


async def assert_open(ws: Any, fake_llm: Any, text: str = "still here") -> None:
    assert await ws.receive_nothing(timeout=0.2)
    fake_llm.script(text)
    await ws.send_json_to({"type": "send", "content": "are you there?"})
    assert (await until(ws, "done"))[-1]["message"]["content"] == text


async def _refused_at_handshake(session: ChatSession, cookie: str) -> bool:
    connected, code = await socket_for(session.pk, cookie).connect(timeout=TIMEOUT)
    return not connected and code == REVOKED


# --- logout ------------------------------------------------------------------------------------


async def test_logout_closes_that_logins_sockets_and_no_other(owner, outsider, fake_llm):
    first, second = await new_session(owner), await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)
    a1, a2 = await ws_open(first.pk, browser_a), await ws_open(second.pk, browser_a)
    b = await ws_open(first.pk, browser_b)
    theirs_session = await new_session(outsider)
    theirs = await ws_open(theirs_session.pk, await cookie_of(outsider))

    await in_thread(_logout)(browser_a)

    await assert_revoked(a1, first, fake_llm)
    await assert_revoked(a2, second, fake_llm)
    assert await _refused_at_handshake(first, browser_a)
    # The other browser of the same user, and another user, carry on.
    await assert_open(b, fake_llm)
    await assert_open(theirs, fake_llm)
    for ws in (b, theirs):
        await ws.disconnect()


async def test_a_send_queued_behind_a_reply_is_dropped_when_its_login_ends(owner, fake_llm):
    """A send waits (up to CHAT_SEND_QUEUE_SECONDS) while the session's reply generates; the
    login that made it ends meanwhile: it must not be stored when the reply finishes."""
    session = await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)
    fake_llm.script({"content": words(400), "token_ms": 20}, "answer to the queued send")
    b = await ws_open(session.pk, browser_b)
    await b.send_json_to({"type": "send", "content": "a long one"})
    await until(b, "delta")
    a = await ws_open(session.pk, browser_a)
    await a.send_json_to({"type": "send", "content": "queued behind it"})
    await asyncio.sleep(0.3)  # waiting in the queue
    await in_thread(_logout)(browser_a)
    code, _ = await closed_with(a)
    assert code == REVOKED
    await a.disconnect()
    await b.send_json_to({"type": "cancel"})
    assert (await until(b, "done"))[-1]["message"]["status"] == "cancelled"
    await asyncio.sleep(0.5)  # the queue polls every 0.1 s
    contents = await in_thread(
        lambda: list(
            ChatMessage.objects.filter(session_id=session.pk, role="user").values_list(
                "content", flat=True
            )
        )
    )()
    assert contents == ["a long one"]
    assert fake_llm.count("chat") == 1
    await b.disconnect()


# --- password change and deactivation: every login of the user --------------------------------


@pytest.fixture(params=["own_password_view", "admin_password_form", "set_password_and_save"])
def password_change(request) -> Any:
    return request.param


async def test_a_password_change_closes_every_socket_of_the_user_and_revokes_tokens(
    password_change, outsider, fake_llm
):
    owner = await in_thread(UserFactory)(username="staffer", is_staff=True)
    first, second = await new_session(owner), await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)
    token = await in_thread(_token)(owner)
    assert await in_thread(_api_status)(token) == 200
    sockets = [
        (await ws_open(first.pk, browser_a), first),
        (await ws_open(second.pk, browser_a), second),
        (await ws_open(first.pk, browser_b), first),
    ]
    theirs_session = await new_session(outsider)
    theirs = await ws_open(theirs_session.pk, await cookie_of(outsider))
    their_token = await in_thread(_token)(outsider)

    if password_change == "own_password_view":
        await in_thread(_change_own_password)(browser_a)
    elif password_change == "admin_password_form":
        await in_thread(_admin_sets_password)(owner.pk)
    else:
        await in_thread(_set_password_and_save)(owner.pk)

    for ws, session in sockets:
        await assert_revoked(ws, session, fake_llm)
    assert await in_thread(_api_status)(token) == 401
    assert await _refused_at_handshake(first, browser_b)
    await assert_open(theirs, fake_llm)
    assert await in_thread(_api_status)(their_token) == 200
    await theirs.disconnect()


async def test_deactivation_closes_every_socket_of_the_user_and_refuses_tokens(
    owner, outsider, fake_llm
):
    session = await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)
    token = await in_thread(_token)(owner)
    a, b = await ws_open(session.pk, browser_a), await ws_open(session.pk, browser_b)
    theirs_session = await new_session(outsider)
    theirs = await ws_open(theirs_session.pk, await cookie_of(outsider))

    await in_thread(_deactivate)(owner.pk)

    await assert_revoked(a, session, fake_llm)
    await assert_revoked(b, session, fake_llm)
    assert await in_thread(_api_status)(token) == 401
    assert await _refused_at_handshake(session, browser_a)
    await assert_open(theirs, fake_llm)
    await theirs.disconnect()


async def test_a_deactivation_no_signal_saw_still_refuses_sends(owner, fake_llm):
    """QuerySet.update() sends no signal, so nothing closes the socket; the ownership check
    (`session_for_user`, owner__is_active) refuses the send all the same."""
    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    await in_thread(lambda: get_user_model().objects.filter(pk=owner.pk).update(is_active=False))()
    await ws.send_json_to({"type": "send", "content": "anyone?"})
    event = await ws.receive_json_from(timeout=TIMEOUT)
    assert event["type"] == "error" and event["code"] == "not_found"
    assert await count_of(session) == 0
    assert fake_llm.count("chat") == 0
    await ws.disconnect()


async def test_other_saves_of_the_user_leave_sockets_open(owner, fake_llm):
    session = await new_session(owner)
    cookie = await cookie_of(owner)
    ws = await ws_open(session.pk, cookie)

    def edits() -> None:
        user = get_user_model().objects.get(pk=owner.pk)
        user.first_name = "Renamed"
        user.save()
        # Logging in again (another browser) saves last_login.
        assert Client().login(username=owner.username, password=PASSWORD)

    await in_thread(edits)()
    await assert_open(ws, fake_llm)
    await ws.disconnect()


async def test_a_password_change_that_rolls_back_closes_nothing(owner, fake_llm):
    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    token = await in_thread(_token)(owner)

    def change_then_fail() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            _set_password_and_save(owner.pk)
            raise RuntimeError("the request failed after the save")

    await in_thread(change_then_fail)()
    await assert_open(ws, fake_llm)
    assert await in_thread(_api_status)(token) == 200
    await ws.disconnect()


# --- through the channel layer (other processes) -----------------------------------------------

needs_shared_layer = pytest.mark.skipif(
    not django_settings.REDIS_URL, reason="needs REDIS_URL (a channel layer shared by processes)"
)


@needs_shared_layer
async def test_a_revocation_published_by_another_process_closes_the_sockets(owner, fake_llm):
    assert layer_is_shared(get_channel_layer())
    session = await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)
    a, b = await ws_open(session.pk, browser_a), await ws_open(session.pk, browser_b)
    layer = get_channel_layer()
    # Another process logs browser A out: only A's socket closes.
    await layer.group_send(login_group(browser_a), {"type": "chat.revoke", "origin": "elsewhere"})
    await assert_revoked(a, session, fake_llm)
    assert await b.receive_nothing(timeout=0.3)
    # This process's own revocations coming back through the layer are not acted on twice.
    from chat.events import ORIGIN

    await layer.group_send(user_group(owner.pk), {"type": "chat.revoke", "origin": ORIGIN})
    assert await b.receive_nothing(timeout=0.3)
    # Another process changes the password: every socket of the user closes.
    await layer.group_send(user_group(owner.pk), {"type": "chat.revoke", "origin": "elsewhere"})
    await assert_revoked(b, session, fake_llm)


@needs_shared_layer
async def test_revocations_here_are_published_for_other_processes(owner):
    layer = get_channel_layer()
    cookie = await cookie_of(owner)
    listener = await layer.new_channel()
    await layer.group_add(login_group(cookie), listener)
    await layer.group_add(user_group(owner.pk), listener)
    await in_thread(_logout)(cookie)
    message = await asyncio.wait_for(layer.receive(listener), TIMEOUT)
    assert message["type"] == "chat.revoke"
    await in_thread(_set_password_and_save)(owner.pk)
    message = await asyncio.wait_for(layer.receive(listener), TIMEOUT)
    assert message["type"] == "chat.revoke"
    await layer.group_discard(login_group(cookie), listener)
    await layer.group_discard(user_group(owner.pk), listener)


# --- two server processes on PostgreSQL and Redis ----------------------------------------------


@pytest.fixture
def daphne(transactional_db, tmp_path) -> Iterator[Any]:
    from bench.procs import ServerProcess, database_url

    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(connection.settings_dict),
        REDIS_URL=django_settings.REDIS_URL,
        # This process's prefix: what it publishes must reach the server's sockets.
        REDIS_PREFIX=django_settings.REDIS_PREFIX,
        SECRET_KEY=django_settings.SECRET_KEY,
        DEBUG="false",
        CHAT_BACKGROUND_COMPACTION="false",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    server = ServerProcess.app(env=env, log_path=tmp_path / "daphne.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.mark.postgres_only
@pytest.mark.skipif(
    "postgresql" not in django_settings.DATABASES["default"]["ENGINE"]
    or not django_settings.REDIS_URL,
    reason="needs DATABASE_URL=postgres://... and REDIS_URL (a server process shares both)",
)
async def test_revocations_close_sockets_held_by_another_server_process(daphne, owner):
    import websockets

    session = await new_session(owner)
    browser_a, browser_b = await cookie_of(owner), await cookie_of(owner)

    def connect(cookie: str) -> Any:
        return websockets.connect(
            f"ws://127.0.0.1:{daphne.port}/ws/chat/{session.pk}/",
            additional_headers={"Cookie": f"sessionid={cookie}", "Origin": daphne.url},
            open_timeout=10,
        )

    async def close_code(ws: Any) -> int | None:
        try:
            await asyncio.wait_for(ws.wait_closed(), TIMEOUT)
        except TimeoutError:
            return None
        return ws.close_code

    async with connect(browser_a) as a, connect(browser_b) as b:
        await asyncio.sleep(0.2)  # joined their groups
        await in_thread(_logout)(browser_a)
        assert await close_code(a) == REVOKED
        # B's login is another one: still open, and a frame still gets an answer.
        await b.send(json.dumps({"type": "cancel"}))
        reply = json.loads(await asyncio.wait_for(b.recv(), TIMEOUT))
        assert reply["code"] == "nothing_to_cancel"
        await in_thread(_set_password_and_save)(owner.pk)
        assert await close_code(b) == REVOKED
    # A login with the new password (force_login hashes the session with the user as loaded).
    fresh = await in_thread(get_user_model().objects.get)(pk=owner.pk)
    async with connect(await cookie_of(fresh)) as c:
        await asyncio.sleep(0.2)
        await in_thread(_deactivate)(owner.pk)
        assert await close_code(c) == REVOKED


async def test_a_password_changed_where_no_message_reaches_this_process_ends_the_socket_at_its_send(
    owner, fake_llm
):
    """Another process changed the password, and no channel layer the two share carried the
    revocation here (make run's in-memory layer; a probe did it from `manage.py shell`): the
    socket's next send is refused and the socket closed, nothing stored, the model not
    called. Before, the send was stored and answered on the ended login."""
    from django.contrib.auth.hashers import make_password

    session = await new_session(owner)
    ws = await ws_open(session.pk, await cookie_of(owner))
    await assert_open(ws, fake_llm)
    stored, calls = await count_of(session), fake_llm.count("chat")
    # As another process: the row changes, no signal here, no revocation message.
    await database_sync_to_async(get_user_model().objects.filter(pk=owner.pk).update)(
        password=make_password("changed-elsewhere-123")
    )
    await ws.send_json_to({"type": "send", "content": "sent after the password changed"})
    code, _ = await closed_with(ws)
    assert code == REVOKED
    assert await count_of(session) == stored and fake_llm.count("chat") == calls
    await ws.disconnect()
