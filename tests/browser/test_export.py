"""The page's Export menu downloads the session as Markdown and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login, screenshot


def test_export_menu_downloads_the_session(page: Any, app: LiveApp, user: Any) -> None:
    session = ChatSession.objects.create(owner=user, title="Export me")
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(session=session, role=MessageRole.USER, content="什么是 Cadau？"),
            ChatMessage(session=session, role=MessageRole.ASSISTANT, content="A chat app."),
        ]
    )
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector("[data-message-id]")
    page.click("#export > summary")
    assert page.is_visible("#export-markdown") and page.is_visible("#export-json")
    screenshot(page, "export-menu")

    with page.expect_download() as info:
        page.click("#export-markdown")
    download = info.value
    assert download.suggested_filename == f"cadau-session-{session.pk}.md"
    text = Path(download.path()).read_text(encoding="utf-8")
    assert text.startswith("# Export me\n")
    assert "什么是 Cadau？" in text and "A chat app." in text

    if not page.is_visible("#export-json"):  # the menu may have closed on the download
        page.click("#export > summary")
    with page.expect_download() as info:
        page.click("#export-json")
    data = json.loads(Path(info.value.path()).read_text(encoding="utf-8"))
    assert [m["content"] for m in data["messages"]] == ["什么是 Cadau？", "A chat app."]
