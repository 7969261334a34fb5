"""Reading a long chat (static/chat/messages.js, latest.js, plain.js): "Jump to latest" after a
jump and "New messages ↓" only when something new arrived; search snippets and the Questions
list as plain text; a 20,000-character message folded with "Show more". English on a desktop
and Chinese on a 390 px phone."""

from __future__ import annotations

from typing import Any

from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login, say, screenshot, wait_js, wait_socket

LONG = ("A very long pasted log line. " * 700)[:20_000]


def _session(user: Any) -> tuple[ChatSession, int, int]:
    """200 messages: a "**demo**" question early on, a 20,000-character one near the end."""
    session = ChatSession.objects.create(owner=user, title="Reading")
    rows = []
    for i in range(100):
        question = "Run the **demo** now, please" if i == 5 else f"question {i}"
        if i == 97:
            question = LONG
        rows.append(ChatMessage(session=session, role=MessageRole.USER, content=question))
        rows.append(ChatMessage(session=session, role=MessageRole.ASSISTANT, content=f"answer {i}"))
    ChatMessage.objects.bulk_create(rows)
    ChatSession.objects.filter(pk=session.pk).update(message_count=len(rows))
    ids = list(session.messages.order_by("id").values_list("id", flat=True))
    return session, ids[10], ids[194]


def _send_elsewhere(page: Any, app: LiveApp, session: ChatSession, text: str) -> None:
    """Another tab of the same user sends: the page hears of it over its socket."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{app.url}/api/v1/chat/send",
        data={"session_id": session.pk, "content": text},
        headers={"X-CSRFToken": token, "Referer": page.url},
    )
    assert response.ok, response.text()


def test_jump_back_and_new_messages(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    session, demo_id, _ = _session(user)
    login(page, app, user, next_path=f"/chat/{session.pk}/?m={demo_id}")
    wait_socket(page)
    page.wait_for_selector(f"#m-{demo_id}")
    # After a jump nothing is new: the button offers the way back.
    page.wait_for_selector("#new-messages:not([hidden])")
    assert page.inner_text("#new-messages") == say(page, "Jump to latest", "跳到最新")
    _send_elsewhere(page, app, session, "sent from another tab")
    wait_js(page, "document.getElementById('new-messages').dataset.kind === 'new'")
    assert page.inner_text("#new-messages") == say(page, "New messages ↓", "新消息 ↓")
    screenshot(page, f"27-new-messages-{page.variant}")
    page.click("#new-messages")
    page.wait_for_selector("#new-messages", state="hidden")
    wait_js(page, "cadau.win.atLiveEdge")
    assert "sent from another tab" in page.inner_text("#message-list")


def test_long_message_folds_and_unfolds(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    session, _, long_id = _session(user)
    login(page, app, user, next_path=f"/chat/{session.pk}/?m={long_id}")
    node = page.wait_for_selector(f"#m-{long_id}")
    box = node.bounding_box()
    assert box is not None and box["height"] < 700, box
    fold = node.query_selector(".fold-btn")
    assert fold is not None and fold.inner_text() == say(page, "Show more", "展开全文")
    assert fold.get_attribute("aria-expanded") == "false"
    screenshot(page, f"27-folded-{page.variant}")
    fold.click()
    wait_js(page, f"document.querySelector('#m-{long_id} .fold-btn').ariaExpanded === 'true'")
    box = page.locator(f"#m-{long_id}").bounding_box()
    assert box is not None and box["height"] > 2000
    assert page.inner_text(f"#m-{long_id} .fold-btn") == say(page, "Show less", "收起")
    # The text is all there (Copy copies all of it either way).
    assert len(page.inner_text(f"#m-{long_id} .msg-body")) >= 19_000


def test_snippets_and_questions_are_plain_text(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    session, _, _ = _session(user)
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    if page.phone:
        page.click("#more-btn")
    page.click("#toggle-turns")
    page.wait_for_selector(".turn-link")
    page.evaluate("(p => p.scrollTop = p.scrollHeight)(document.getElementById('turns-panel'))")
    item = page.wait_for_selector(".turn-link:has-text('Run the demo now')")
    assert "**" not in item.inner_text()
    page.keyboard.press("Escape")
    if page.phone:
        page.click("#open-sidebar")
    page.fill("#search-input", "demo")
    hit = page.wait_for_selector(".search-hit .search-snippet mark")
    snippet = page.inner_text(".search-hit .search-snippet")
    assert "Run the demo now" in snippet and "**" not in snippet
    assert hit.inner_text().lower() == "demo"
    screenshot(page, f"27-plain-snippets-{page.variant}")
