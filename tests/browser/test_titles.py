"""A new chat is named after its first message as soon as the reply is stored: the header, the
tab and the sidebar entry change without a reload."""

from __future__ import annotations

import re
from typing import Any

from chat.models import ChatSession
from tests.browser.conftest import LiveApp, login, screenshot
from tests.browser.test_chat_page import wait_js


def test_a_new_chat_takes_its_first_message_as_its_name(page: Any, app: LiveApp, user: Any) -> None:
    login(page, app, user)
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    session_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
    link = f'#session-list li[data-session-id="{session_id}"] .session-link'
    page.wait_for_selector(link)
    untitled = page.text_content(link)

    app.fake.script("Plenty of <b>ideas</b>.")
    page.fill("#composer-input", "Ideas for a <b>rainy</b> Sunday\nwith kids")
    page.press("#composer-input", "Enter")
    name = "Ideas for a <b>rainy</b> Sunday"
    wait_js(page, f"document.getElementById('chat-title').textContent === {name!r}")
    assert page.text_content(link) == name != untitled
    assert page.title() == f"{name} · Cadau"
    # Text, never markup: no <b> element came from the title.
    assert page.locator("#chat-title b, #session-list b").count() == 0
    assert ChatSession.objects.get(pk=session_id).title == name
    screenshot(page, "auto-title")
