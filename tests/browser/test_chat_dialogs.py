"""The page's dialogs (static/chat/dialog.js) instead of window.prompt / confirm: rename,
delete with a few seconds to undo (static/chat/sessions.js), and edit-and-resend saying how
many later messages go (static/chat/edit.js). Labelled, Tab stays inside, Esc cancels, focus
returns. English on a desktop and Chinese on a 390 px phone."""

from __future__ import annotations

import time
from typing import Any

from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login, say, screenshot, wait_js

UNDO_SECONDS = 6  # static/chat/sessions.js UNDO_MS


def _open_sidebar(page: Any) -> None:
    if page.phone:
        page.click("#open-sidebar")
        wait_js(page, "document.getElementById('sidebar').getBoundingClientRect().x >= 0")


def _dialog_is_accessible(page: Any) -> None:
    """Modal, named by its heading, and Tab never leaves it."""
    info = page.evaluate(
        """(() => {
          const d = document.getElementById('app-dialog');
          const title = document.getElementById(d.getAttribute('aria-labelledby'));
          return {modal: d.matches(':modal'), title: title && title.textContent};
        })()"""
    )
    assert info["modal"] and info["title"]
    inside = "document.getElementById('app-dialog').contains(document.activeElement)"
    for _ in range(6):
        page.keyboard.press("Tab")
        assert page.evaluate(inside)


def test_rename_and_delete_with_undo(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    keep = ChatSession.objects.create(owner=user, title="Keep me")
    doomed = ChatSession.objects.create(owner=user, title="Delete me")
    login(page, app, user, next_path=f"/chat/{keep.pk}/")
    page.wait_for_selector(f'.session[data-session-id="{doomed.pk}"]')
    _open_sidebar(page)
    row = f'.session[data-session-id="{doomed.pk}"]'

    # Rename: the dialog opens with the title, Esc cancels and gives focus back.
    page.click(f"{row} [data-action=rename]")
    page.wait_for_selector("#app-dialog[open]")
    assert page.input_value("#dialog-input") == "Delete me"
    assert page.inner_text("#dialog-title") == say(page, "Rename chat", "重命名对话")
    _dialog_is_accessible(page)
    page.keyboard.press("Escape")
    page.wait_for_selector("#app-dialog", state="detached")
    assert page.evaluate("document.activeElement.dataset.action") == "rename"
    assert ChatSession.objects.get(pk=doomed.pk).title == "Delete me"
    page.click(f"{row} [data-action=rename]")
    page.fill("#dialog-input", "待删除")
    page.press("#dialog-input", "Enter")
    wait_js(page, f"document.querySelector('{row} .session-link').textContent === '待删除'")
    assert ChatSession.objects.get(pk=doomed.pk).title == "待删除"

    # Delete, then Undo within the time: the chat comes back and was never deleted.
    page.click(f"{row} [data-action=delete]")
    page.wait_for_selector("#app-dialog[open]")
    assert "待删除" in page.inner_text("#dialog-title")
    assert say(page, "undo", "撤销") in page.inner_text("#dialog-text")
    # Focus starts on Cancel: Enter alone does not delete.
    assert page.evaluate("document.activeElement.dataset.dialog") == "cancel"
    screenshot(page, f"27-delete-dialog-{page.variant}")
    page.click("#app-dialog [data-dialog=confirm]")
    page.wait_for_selector("#undo-bar:not([hidden])")
    assert page.locator(row).is_hidden()
    assert say(page, "deleted", "已删除") in page.inner_text("#undo-text")
    screenshot(page, f"27-undo-{page.variant}")
    page.click("#undo-btn")
    assert page.locator(row).is_visible()
    time.sleep(UNDO_SECONDS + 1)
    assert ChatSession.objects.filter(pk=doomed.pk).exists()

    # Delete for good: the API is called once the undo time is over.
    page.click(f"{row} [data-action=delete]")
    page.click("#app-dialog [data-dialog=confirm]")
    assert ChatSession.objects.filter(pk=doomed.pk).exists()  # not yet
    deadline = time.monotonic() + UNDO_SECONDS + 5
    while ChatSession.objects.filter(pk=doomed.pk).exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not ChatSession.objects.filter(pk=doomed.pk).exists()
    page.wait_for_selector(row, state="detached")
    assert page.locator("#undo-bar").is_hidden()


def test_edit_and_resend_says_what_goes(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    session = ChatSession.objects.create(owner=user, title="Edit")
    rows = []
    for i in range(3):
        rows.append(ChatMessage(session=session, role=MessageRole.USER, content=f"question {i}"))
        rows.append(ChatMessage(session=session, role=MessageRole.ASSISTANT, content=f"answer {i}"))
    ChatMessage.objects.bulk_create(rows)
    first = ChatMessage.objects.filter(session=session).order_by("id").first()
    assert first is not None
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_js(page, "document.documentElement.dataset.socket === 'open'")
    node = page.locator(f"#m-{first.pk}")
    node.hover()
    node.locator("[data-action=edit]").click()
    page.fill(".edit-input", "question 0, edited")
    page.click(".edit-form button[type=submit]")
    page.wait_for_selector("#app-dialog[open]")
    text = page.inner_text("#dialog-text")
    assert say(page, "the 5 messages after it", "其后的 5 条消息") in text, text
    _dialog_is_accessible(page)
    screenshot(page, f"27-edit-dialog-{page.variant}")
    # Cancel: nothing deleted, the editor is still open with the new text.
    page.click("#app-dialog [data-dialog=cancel]")
    page.wait_for_selector("#app-dialog", state="detached")
    assert ChatMessage.objects.filter(session=session).count() == 6
    assert page.input_value(".edit-input") == "question 0, edited"
    page.click(".edit-form button[type=submit]")
    page.click("#app-dialog [data-dialog=confirm]")
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('Echo: question 0, edited'))",
    )
    first_now = session.messages.order_by("id").first()
    assert first_now is not None and first_now.content == "question 0, edited"
    assert session.messages.count() == 2
