"""Compression as Chromium gets it from the real server (Daphne): the page and the history
JSON gzipped, the scripts and stylesheets Brotli, and the event stream of a send plain."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cadau.tokens import token_issue
from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login
from tests.browser.variants import VARIANT_IDS, VARIANTS, Variant, variant_page


@pytest.mark.parametrize("variant", VARIANTS[::3], ids=VARIANT_IDS[::3])
def test_chromium_gets_compressed_pages_json_and_files(
    browser: Any, app: LiveApp, user: Any, variant: Variant
) -> None:
    session = ChatSession.objects.create(owner=user, title="Compressed")
    ChatMessage.objects.bulk_create(
        ChatMessage(session=session, role=MessageRole.USER, content=f"message {i} " * 20)
        for i in range(20)
    )
    with variant_page(browser, variant) as page:
        login(page, app, user)
        encodings: dict[str, str] = {}
        page.on(
            "response",
            lambda r: encodings.__setitem__(r.url, r.headers.get("content-encoding", "")),
        )
        page.goto(f"{app.url}/chat/{session.pk}/")
        page.wait_for_selector("[data-message-id]")
        page.wait_for_load_state("networkidle")
        assert encodings[f"{app.url}/chat/{session.pk}/"] == "gzip"
        history = [url for url in encodings if "/api/v1/chat/history" in url]
        assert history and all(encodings[url] == "gzip" for url in history)
        assert encodings[f"{app.url}/static/chat/app.js"] == "br"
        assert encodings[f"{app.url}/static/chat/app.css"] == "br"
        # The page still works, under its CSP.
        assert page.locator("[data-message-id]").count() == 20
        assert page.evaluate("window.__cspViolations") == []


def test_the_event_stream_is_sent_plain(app: LiveApp, user: Any) -> None:
    session = ChatSession.objects.create(owner=user)
    token = token_issue(user=user).key
    app.fake.script({"content": "one two three four five", "token_ms": 5})
    headers = {
        "Authorization": f"Token {token}",
        "Accept": "text/event-stream",
        "Accept-Encoding": "gzip, br",
    }
    with httpx.stream(
        "POST",
        f"{app.url}/api/v1/chat/send",
        json={"session_id": session.pk, "content": "hi"},
        headers=headers,
        timeout=20,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in response.headers
        body = response.read().decode()
    assert '"type": "done"' in body or '"type":"done"' in body
