"""Regenerate refused by the server: the page puts the reply back and Send works again.

The refusals are real: another client changes the session over the API while the page's
socket events are held up in Playwright's WebSocket route (as when they are still on their
way), so the page asks to regenerate a reply the server no longer lets it: 409
`reply_in_progress` (that reply is being regenerated elsewhere, with a slow fake model) or
400 `not_last_reply` (a newer turn was sent)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from tests.browser.conftest import PASSWORD, LiveApp, login

FIRST_ANSWER = "The first answer."


class HeldSocket:
    """The page's WebSocket, routed through Playwright to the real server. While `held`, what
    the server sends waits here; `release()` delivers it in order."""

    def __init__(self, page: Any) -> None:
        self.held = False
        self._waiting: list[str | bytes] = []
        self._route: Any = None
        page.route_web_socket(re.compile(r"/ws/chat/\d+/$"), self._connect)

    def _connect(self, route: Any) -> None:
        self._route = route
        server = route.connect_to_server()
        server.on_message(self._from_server)  # page -> server frames pass untouched

    def _from_server(self, message: str | bytes) -> None:
        if self.held:
            self._waiting.append(message)
        else:
            self._route.send(message)

    def release(self) -> None:
        self.held = False
        for message in self._waiting:
            self._route.send(message)
        self._waiting.clear()


class OtherClient:
    """Another program on the same account, over the token API, in a thread (its JSON calls
    answer only once the reply is finished)."""

    def __init__(self, app: LiveApp, user: Any) -> None:
        self.http = httpx.Client(base_url=app.url, timeout=60)
        token = self.http.post(
            "/api/v1/auth/token", json={"username": user.username, "password": PASSWORD}
        ).json()["token"]
        self.http.headers["Authorization"] = f"Token {token}"
        self.thread: threading.Thread | None = None
        self.status: int | None = None

    def post_in_background(self, path: str, body: dict[str, Any]) -> None:
        def run() -> None:
            self.status = self.http.post(path, json=body).status_code

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self) -> int | None:
        assert self.thread is not None
        self.thread.join(timeout=60)
        return self.status


@pytest.fixture
def other(app: LiveApp, user: Any) -> Iterator[OtherClient]:
    client = OtherClient(app, user)
    yield client
    if client.thread is not None:
        client.thread.join(timeout=60)
    client.http.close()


def _one_turn(user: Any) -> tuple[ChatSession, ChatMessage]:
    session = ChatSession.objects.create(owner=user, title="Regenerate")
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="A question")
    reply = ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content=FIRST_ANSWER
    )
    ChatSession.objects.filter(pk=session.pk).update(message_count=2)
    return session, reply


def _open(page: Any, app: LiveApp, user: Any, session: ChatSession) -> HeldSocket:
    socket = HeldSocket(page)
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_function("() => document.documentElement.dataset.socket === 'open'")
    page.wait_for_selector('[data-role="assistant"] [data-action="regenerate"]')
    return socket


def _regenerate_elsewhere_slowly(app: LiveApp, other: OtherClient, reply: ChatMessage) -> None:
    slow = " ".join(f"slow{i}" for i in range(40))
    app.fake.script({"content": slow, "token_ms": 50})
    other.post_in_background(
        "/api/v1/chat/regenerate", {"session_id": reply.session_id, "message_id": reply.pk}
    )
    for _ in range(100):
        reply.refresh_from_db()
        if reply.status == MessageStatus.STREAMING:
            return
        time.sleep(0.05)
    raise AssertionError("the other client's regenerate did not start")


def _click_regenerate(page: Any, reply: ChatMessage) -> None:
    node = page.locator(f"#m-{reply.pk}")
    node.hover()
    node.locator('[data-action="regenerate"]').click()


def _assert_recovered(page: Any, reply: ChatMessage, server_message: str) -> None:
    """The reply shows what it showed before, Send works, and the notice says why."""
    page.wait_for_selector('#notice[data-level="error"]:not([hidden])')
    assert server_message in page.inner_text("#notice")
    node = page.locator(f"#m-{reply.pk}")
    assert node.get_attribute("data-status") == "complete"
    assert node.locator(".msg-body").inner_text() == FIRST_ANSWER
    assert node.locator(".msg-state.streaming").count() == 0
    assert page.locator("#send-btn").is_enabled()
    assert page.locator("#stop-btn").is_hidden()


def test_regenerate_refused_while_that_reply_generates_elsewhere(
    page: Any, app: LiveApp, user: Any, other: OtherClient
) -> None:
    session, reply = _one_turn(user)
    socket = _open(page, app, user, session)
    socket.held = True
    _regenerate_elsewhere_slowly(app, other, reply)

    _click_regenerate(page, reply)
    _assert_recovered(page, reply, "That reply is still being generated.")

    # The held events arrive: the page follows the other client's reply to its end.
    socket.release()
    page.wait_for_selector(f'#m-{reply.pk}[data-status="complete"] >> text=slow39')
    assert other.wait() == 200
    assert page.locator("#send-btn").is_enabled()


def test_regenerate_refused_when_a_newer_turn_exists(
    page: Any, app: LiveApp, user: Any, other: OtherClient
) -> None:
    session, reply = _one_turn(user)
    socket = _open(page, app, user, session)
    socket.held = True
    app.fake.script("The newer answer.")
    other.post_in_background("/api/v1/chat/send", {"session_id": session.pk, "content": "Newer"})
    assert other.wait() == 200

    _click_regenerate(page, reply)
    _assert_recovered(page, reply, "Only the last reply of a session can be regenerated.")

    # The newer turn arrives; regenerate now belongs to its reply.
    socket.release()
    page.wait_for_selector('[data-role="assistant"][data-status="complete"] >> text=newer answer')
    assert page.locator('[data-role="assistant"]').count() == 2
    assert page.locator(f'#m-{reply.pk} [data-action="regenerate"]').count() == 0
    page.wait_for_selector(f"#m-{reply.pk} >> text={FIRST_ANSWER}")


def test_regenerate_refused_over_the_rest_stream(
    page: Any, app: LiveApp, user: Any, other: OtherClient
) -> None:
    """No WebSocket gets through (a proxy refusing the upgrade): regenerate falls back to the
    REST event stream, which the server refuses the same way."""
    session, reply = _one_turn(user)
    page.route_web_socket(re.compile(r"/ws/chat/\d+/$"), lambda route: route.close())
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector('[data-role="assistant"] [data-action="regenerate"]')
    _regenerate_elsewhere_slowly(app, other, reply)

    _click_regenerate(page, reply)
    _assert_recovered(page, reply, "That reply is still being generated.")
    assert page.evaluate("document.documentElement.dataset.socket") is None
    assert other.wait() == 200
