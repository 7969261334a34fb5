"""Replies rendered once per process (chat/rendered.py): the history's `render=html` pages
render a finished reply the first time it is asked for, and again only when its text changed."""

from __future__ import annotations

import pytest

from chat import rendered
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.rendering import render_markdown


@pytest.fixture
def renders(monkeypatch):
    """The texts chat/rendered.py asked chat/rendering.py to render."""
    asked: list[str] = []

    def counted(text: str) -> str:
        asked.append(text)
        return render_markdown(text)

    monkeypatch.setattr(rendered, "render_markdown", counted)
    return asked


def _html(api, session):
    page = api.get("/api/v1/chat/history", {"session_id": session.pk, "render": "html"})
    assert page.status_code == 200
    return [m.get("content_html") for m in page.json()["messages"]]


@pytest.mark.django_db
def test_a_finished_reply_is_rendered_once_and_again_when_its_text_changes(api, owner, renders):
    session = ChatSession.objects.create(owner=owner)
    reply = ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="**one** `x < 2`"
    )
    first = _html(api, session)
    assert first == ["<p><strong>one</strong> <code>x &lt; 2</code></p>\n"]
    assert _html(api, session) == first and len(renders) == 1
    # Edited in the admin (or regenerated under its id): its new text is rendered.
    ChatMessage.objects.filter(pk=reply.pk).update(content="**two**")
    assert _html(api, session) == ["<p><strong>two</strong></p>\n"]
    assert renders == ["**one** `x < 2`", "**two**"]


@pytest.mark.django_db
def test_a_streaming_reply_is_rendered_every_time(api, owner, renders):
    session = ChatSession.objects.create(owner=owner)
    ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="so far",
        status=MessageStatus.STREAMING,
    )
    assert _html(api, session) == _html(api, session) == ["<p>so far</p>\n"]
    assert len(renders) == 2


def test_the_cache_keeps_what_its_bound_holds_newest_used_last_out(monkeypatch, renders):
    monkeypatch.setattr(rendered, "CACHE_RUNES_MAX", 25)
    monkeypatch.setattr(rendered, "ENTRY_RUNES_MAX", 20)
    html = {n: rendered.reply_html(message_id=n, content=f"m{n}", final=True) for n in (1, 2)}
    assert html == {1: "<p>m1</p>\n", 2: "<p>m2</p>\n"}  # 10 characters each: both kept
    rendered.reply_html(message_id=1, content="m1", final=True)  # used: 2 is now the oldest
    rendered.reply_html(message_id=3, content="m3", final=True)  # 30 > 25: 2 goes
    assert len(renders) == 3
    rendered.reply_html(message_id=1, content="m1", final=True)
    rendered.reply_html(message_id=2, content="m2", final=True)
    assert renders == ["m1", "m2", "m3", "m2"]
    # One past the entry's bound is never kept.
    long = "y" * 30
    for _ in range(2):
        rendered.reply_html(message_id=4, content=long, final=True)
    assert renders.count(long) == 2
