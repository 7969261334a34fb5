"""A reply the model did not finish (its token limit, or a server that ended the stream) is
shown as it came, says so, and the newest one can be continued."""

from __future__ import annotations

from typing import Any

from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login


def _session_with_cut_reply(user: Any, cut: str) -> tuple[ChatSession, ChatMessage]:
    session = ChatSession.objects.create(owner=user, title="Cut")
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="Count to ten")
    reply = ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="one two three",
        metadata={"finish_reason": "length" if cut == "length" else None, "cut": cut},
    )
    ChatSession.objects.filter(pk=session.pk).update(message_count=2)
    return session, reply


def test_a_cut_reply_says_so_and_continue_sends_a_new_turn(page: Any, app: LiveApp, user: Any):
    session, reply = _session_with_cut_reply(user, "length")
    app.fake.script("four five six seven eight nine ten")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_function("() => document.documentElement.dataset.socket === 'open'")
    state = page.locator(f"#m-{reply.pk} .msg-state.cut")
    state.wait_for()
    assert "length limit" in state.inner_text()
    state.locator('[data-action="continue"]').click()
    page.wait_for_selector('[data-role="assistant"][data-status="complete"] >> text=four five')
    turns = list(ChatMessage.objects.filter(session=session).order_by("id"))
    assert [m.role for m in turns] == ["user", "assistant", "user", "assistant"]
    assert turns[2].content == "Please continue where you stopped."
    # The continued reply is the newest now: the old one keeps its note, without the button.
    assert page.locator(f"#m-{reply.pk} [data-action='continue']").count() == 0
    assert page.locator(f"#m-{reply.pk} .msg-state.cut").count() == 1


def test_an_interrupted_reply_is_labelled_in_chinese(browser: Any, app: LiveApp, user: Any):
    session, reply = _session_with_cut_reply(user, "interrupted")
    context = browser.new_context(locale="zh-CN")
    try:
        page = context.new_page()
        login(page, app, user, next_path=f"/chat/{session.pk}/")
        state = page.locator(f"#m-{reply.pk} .msg-state.cut")
        state.wait_for()
        assert "回复在模型完成之前就结束了" in state.inner_text()
        assert state.locator('[data-action="continue"]').inner_text() == "继续"
    finally:
        context.close()
