"""cadau/asgihandler.py and cadau/deferred.py: a sync view and its whole middleware chain on one
HTTP thread, an async view on the loop, and deferred work awaited on the loop with the
middleware's headers and cookies carried over. Through the ASGI application, as Daphne runs it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path

from cadau.asgi import application
from cadau.asgihandler import ASGIHandler
from cadau.contextconfig import ContextConfig
from cadau.deferred import DeferredResponse, deferred_resolve
from cadau.tokens import token_issue
from chat.api import send as send_view
from chat.errors import CompactionFailed
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.turn import service as turn_service
from tests.factories import ChatSessionFactory, make_conversation
from tests.fixtures_llm import summary_of

pytestmark = pytest.mark.django_db(transaction=True)

# --- A URLconf and a middleware of this module's own, to see which thread runs what ---------

seen: dict[str, str] = {}


class ThreadRecordingMiddleware:
    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        seen["request"] = threading.current_thread().name
        response = self.get_response(request)
        seen["response"] = threading.current_thread().name
        return response


def sync_view(request: HttpRequest) -> HttpResponse:
    seen["view"] = threading.current_thread().name
    return JsonResponse({"ok": True})


async def async_view(request: HttpRequest) -> HttpResponse:
    seen["view"] = threading.current_thread().name
    return JsonResponse({"ok": True})


def deferred_view(request: HttpRequest) -> HttpResponse:
    request.session["touched"] = True  # the session middleware sets its cookie on the placeholder

    async def then() -> HttpResponse:
        seen["then"] = threading.current_thread().name
        return JsonResponse({"deferred": True})

    return DeferredResponse(then)


def deferred_crash_view(request: HttpRequest) -> HttpResponse:
    async def then() -> HttpResponse:
        raise RuntimeError("a bug in deferred work")

    return DeferredResponse(then)


urlpatterns = [
    path("sync", sync_view),
    path("async", async_view),
    path("deferred", deferred_view),
    path("deferred-crash", deferred_crash_view),
]


@pytest.fixture
def handler(settings) -> ASGIHandler:
    settings.ROOT_URLCONF = __name__
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.ThreadRecordingMiddleware"]
    seen.clear()
    return ASGIHandler()


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


async def test_a_sync_view_and_its_middleware_run_on_one_http_thread(handler):
    async with _client(handler) as client:
        response = await client.get("/sync")
    assert response.status_code == 200
    assert seen["request"] == seen["view"] == seen["response"]
    assert seen["view"].startswith("cadau-http")
    # Django's own middleware ran too (in the same hop).
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_sync_view_starts_no_thread_of_its_own(handler, monkeypatch):
    """Django wraps each request in a ThreadSensitiveContext, which started a thread for the
    request's signal receivers and another to join it; a sync view's request needs neither."""
    async with _client(handler) as client:
        await client.get("/sync")  # the pool's threads start at the first request
        started: list[str] = []
        start = threading.Thread.start

        def counted(thread: threading.Thread) -> None:
            started.append(thread.name)
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)
        for _ in range(5):
            assert (await client.get("/sync")).status_code == 200
    # The HTTP pool itself may still grow (up to HTTP_THREADS: a request submitted before the
    # last one's thread was back waiting starts another, as a loaded CI machine showed); no
    # thread of any other kind may start.
    assert [name for name in started if not name.startswith("cadau-http")] == []


async def test_an_async_view_stays_on_the_loop_with_the_middleware(handler):
    loop_thread = threading.current_thread().name
    async with _client(handler) as client:
        response = await client.get("/async")
    assert response.status_code == 200
    assert seen["view"] == loop_thread
    assert response.headers["X-Frame-Options"] == "DENY"


async def test_a_deferred_response_is_awaited_on_the_loop_with_the_middlewares_headers(handler):
    loop_thread = threading.current_thread().name
    async with _client(handler) as client:
        response = await client.get("/deferred")
    assert response.status_code == 200
    assert response.json() == {"deferred": True}
    assert seen["then"] == loop_thread
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Content-Length"] == str(len(response.content))
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "Cookie" in response.headers["Vary"]
    assert "sessionid" in response.cookies


async def test_a_crash_in_deferred_work_is_a_logged_500(handler, caplog):
    async with _client(handler) as client:
        response = await client.get("/deferred-crash")
    assert response.status_code == 500
    assert "a bug in deferred work" in caplog.text
    assert response.headers["X-Frame-Options"] == "DENY"  # the middleware's, carried


def test_without_our_handler_the_middleware_resolves_it(settings):
    """Django's test client (a sync handler): DeferredResponseMiddleware awaits it instead."""
    settings.ROOT_URLCONF = __name__
    seen.clear()
    response = Client().get("/deferred")
    assert response.status_code == 200
    assert response.json() == {"deferred": True}
    assert response.cookies["sessionid"].value
    assert response["X-Frame-Options"] == "DENY"


async def test_carried_headers_never_describe_the_placeholders_body():
    async def then() -> HttpResponse:
        final = HttpResponse("final body", content_type="text/plain", headers={"Vary": "Origin"})
        final["X-Own"] = "final"
        return final

    placeholder = DeferredResponse(then)
    placeholder["X-Own"] = "placeholder"
    placeholder["X-Frame-Options"] = "DENY"
    placeholder["Vary"] = "Cookie"
    placeholder.set_cookie("csrftoken", "abc")
    closed: list[str] = []
    placeholder._resource_closers.append(lambda: closed.append("request"))
    response = await deferred_resolve(placeholder)
    assert response.content == b"final body"
    assert response["Content-Type"] == "text/plain"
    assert response["X-Own"] == "final"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Vary"] == "Origin, Cookie"
    assert response.cookies["csrftoken"].value == "abc"
    await sync_to_async(response.close)()
    assert closed == ["request"]


# --- The product's routes through the real application ---------------------------------------

ROUTES = ["/accounts/login/", "/api/v1/status", "/api/v1/nope", "/admin/login/", "/"]
# Differ by nature: the CSRF token is random, the date moves.
UNCOMPARED = {"date", "set-cookie", "content-length"}


@pytest.mark.parametrize("route", ROUTES)
async def test_the_application_answers_as_the_test_client_does(route):
    # Both ask for gzip (httpx would add br and zstd when installed): pages are compressed.
    expected = await sync_to_async(Client().get)(route, HTTP_ACCEPT_ENCODING="gzip")
    async with _client(application) as client:
        response = await client.get(route, headers={"Accept-Encoding": "gzip"})
    assert response.status_code == expected.status_code
    assert {k.lower() for k in response.headers} - UNCOMPARED == {
        k.lower() for k in expected.headers
    } - UNCOMPARED
    for name in (
        "Content-Type",
        "X-Frame-Options",
        "Content-Security-Policy",
        "Vary",
        "Content-Encoding",
    ):
        assert response.headers.get(name) == expected.headers.get(name), name
    assert set(response.cookies) == set(expected.cookies)


async def _token_and_session(owner: Any) -> tuple[str, int]:
    token = await sync_to_async(token_issue)(user=owner)
    session: Any = await sync_to_async(ChatSessionFactory)(owner=owner)
    return token.key, session.pk


async def test_a_json_send_is_the_whole_reply_with_the_middlewares_headers(owner, fake_llm):
    token, session_id = await _token_and_session(owner)
    async with _client(application) as client:
        response = await client.post(
            "/api/v1/chat/send",
            json={"session_id": session_id, "content": "hello"},
            headers={"Authorization": f"Token {token}"},
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["user_message"]["content"] == "hello"
    assert body["assistant_message"]["status"] == MessageStatus.COMPLETE
    assert body["assistant_message"]["content"]
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"


async def test_a_streamed_send_is_its_events(owner, fake_llm):
    token, session_id = await _token_and_session(owner)
    async with _client(application) as client:
        response = await client.post(
            "/api/v1/chat/send",
            json={"session_id": session_id, "content": "hello"},
            headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"},
        )
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    kinds = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "message" and "delta" in kinds and kinds[-1] == "done"
    statuses = await sync_to_async(
        lambda: list(ChatMessage.objects.order_by("id").values_list("status", flat=True))
    )()
    assert statuses == [MessageStatus.COMPLETE, MessageStatus.COMPLETE]


def _send_scope(token: str, session_id: int, accept: str) -> tuple[dict[str, Any], bytes]:
    """An HTTP scope and body for a send, to drive the application as Daphne does."""
    body = json.dumps({"session_id": session_id, "content": "hello"}).encode()
    headers = {
        "Authorization": f"Token {token}",
        "Accept": accept,
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    }
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/chat/send",
        "raw_path": b"/api/v1/chat/send",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }
    return scope, body


def _statuses() -> list[str]:
    return list(ChatMessage.objects.order_by("id").values_list("status", flat=True))


async def _assert_complete_with_a_reply(*, rows: int) -> None:
    """Within 5 s, every one of the `rows` messages complete, the last a reply with text."""
    for _ in range(100):
        if await sync_to_async(_statuses)() == [MessageStatus.COMPLETE] * rows:
            break
        await asyncio.sleep(0.05)
    assert await sync_to_async(_statuses)() == [MessageStatus.COMPLETE] * rows
    reply = await sync_to_async(ChatMessage.objects.order_by("id").last)()
    assert reply is not None and reply.content


@pytest.mark.parametrize(
    ("accept", "made_by"), [("text/event-stream", "_event_stream"), ("application/json", "_defer")]
)
async def test_a_reply_starts_from_the_views_thread(owner, fake_llm, monkeypatch, accept, made_by):
    """The reply starts as the view returns, not when the response is first read (its body,
    or the JSON caller's wait): a client gone while the view ran still gets its reply stored
    whole (Django then cancels the response unread: the reply would not have started)."""
    token, session_id = await _token_and_session(owner)
    gone = threading.Event()
    # The view's response is made only once the client is gone.
    make = getattr(send_view, made_by)

    def after_the_client_left(*args: Any) -> Any:
        assert gone.wait(5)
        time.sleep(0.1)  # and Django has cancelled the request meanwhile
        return make(*args)

    monkeypatch.setattr(send_view, made_by, after_the_client_left)
    scope, body = _send_scope(token, session_id, accept)
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        while not await sync_to_async(_statuses)():  # the view is under way
            await asyncio.sleep(0.01)
        gone.set()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    assert not [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    await _assert_complete_with_a_reply(rows=2)


@pytest.mark.parametrize("accept", ["text/event-stream", "application/json"])
async def test_a_queued_send_stored_as_its_client_left_gets_its_reply(
    owner, fake_llm, monkeypatch, accept
):
    """A send queued behind a running reply, its client gone while its worker stored the turn
    (Django cancels the request's task): the stored turn still gets its reply, not an empty
    `streaming` row that keeps the session busy."""
    token, session_id = await _token_and_session(owner)
    running = await sync_to_async(ChatMessage.objects.create)(
        session_id=session_id, role="assistant", content="", status=MessageStatus.STREAMING
    )
    store = turn_service._run_store
    in_store, gone = threading.Event(), threading.Event()
    tries: list[int] = []

    def store_as_the_client_leaves(**kwargs: Any) -> Any:
        tries.append(1)
        if len(tries) == 1:  # the view's own try: the session is busy, nothing stored
            return store(**kwargs)
        ChatMessage.objects.filter(pk=running.pk).update(status=MessageStatus.COMPLETE)
        stored = store(**kwargs)
        in_store.set()
        assert gone.wait(5)
        return stored

    monkeypatch.setattr(turn_service, "_run_store", store_as_the_client_leaves)
    scope, body = _send_scope(token, session_id, accept)
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        while not in_store.is_set():
            await asyncio.sleep(0.01)
        # The worker returns only once Django has cancelled the request's task.
        asyncio.get_running_loop().call_later(0.2, gone.set)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    await application(scope, receive, send)
    await _assert_complete_with_a_reply(rows=3)


async def test_a_deferred_error_is_the_views_json_error(owner, fake_llm, settings, caplog):
    """A send that queued behind a running reply and waited out CHAT_SEND_QUEUE_SECONDS: the
    409 is decided on the loop, after the view's thread has returned."""
    settings.CHAT_SEND_QUEUE_SECONDS = 0.2
    token, session_id = await _token_and_session(owner)
    await sync_to_async(ChatMessage.objects.create)(
        session_id=session_id, role="assistant", content="", status=MessageStatus.STREAMING
    )
    async with _client(application) as client:
        response = await client.post(
            "/api/v1/chat/send",
            json={"session_id": session_id, "content": "hello"},
            headers={"Authorization": f"Token {token}"},
        )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "reply_in_progress"
    assert "Conflict: /api/v1/chat/send" in caplog.text  # logged as a view's 409 would be
    assert response.headers["X-Frame-Options"] == "DENY"
    assert await sync_to_async(ChatMessage.objects.filter(role="user").count)() == 0


async def test_compact_now_waits_on_the_model_off_the_http_threads(
    owner, fake_llm, settings, monkeypatch
):
    """Seconds of a summarising call hold neither an HTTP thread nor a reply's worker thread."""
    import chat.api.send as send_module

    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=20000, summary_max_runes=500, min_verbatim=2
    )
    token, session_id = await _token_and_session(owner)
    session = await sync_to_async(ChatSession.objects.get)(pk=session_id)
    await sync_to_async(make_conversation)(session, turns=6, words=10)
    fake_llm.script_summary(summary_of("kept the numbers"))
    compact = send_module.session_compact_now
    threads: list[str] = []

    def recorded(**kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return compact(**kwargs)

    monkeypatch.setattr(send_module, "session_compact_now", recorded)
    async with _client(application) as client:
        response = await client.post(
            f"/api/v1/chat/sessions/{session_id}/compact",
            json={"instructions": "keep the numbers"},
            headers={"Authorization": f"Token {token}"},
        )
    assert response.status_code == 200, response.text
    assert response.json()["context_summary"] == summary_of("kept the numbers")
    assert response.headers["X-Frame-Options"] == "DENY"
    assert len(threads) == 1 and threads[0].startswith("cadau-model-wait")


async def test_one_users_compactions_wait_one_at_a_time_and_never_hold_up_anothers(
    owner, outsider, monkeypatch
):
    """A probe: four of one user's compactions of a hanging summariser held the pool's two
    threads, and another user's instant one answered after 39 s. Now a user has one waiting or
    running per process; a second gets 409 at once, and someone else's goes ahead."""
    import chat.api.send as send_module

    release = threading.Event()
    started: list[int] = []

    def slow(*, session_id: int, instructions: str) -> Any:
        started.append(session_id)
        release.wait(10)
        raise CompactionFailed("the summariser answered nothing")

    monkeypatch.setattr(send_module, "session_compact_now", slow)
    token, first = await _token_and_session(owner)
    _, second = await _token_and_session(owner)
    other_token, others = await _token_and_session(outsider)

    async def compact(key: str, session_id: int) -> httpx.Response:
        async with _client(application) as client:
            return await client.post(
                f"/api/v1/chat/sessions/{session_id}/compact",
                json={},
                headers={"Authorization": f"Token {key}"},
            )

    waiting = asyncio.create_task(compact(token, first))
    while not started:
        await asyncio.sleep(0.01)
    refused = await compact(token, second)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "compaction_in_progress"
    theirs = asyncio.create_task(compact(other_token, others))
    while len(started) < 2:
        await asyncio.sleep(0.01)
    assert started == [first, others]
    release.set()
    assert (await waiting).status_code == 502 and (await theirs).status_code == 502
    # Once it ended, the user may compact again.
    assert (await compact(token, second)).status_code == 502
