"""GET /api/v1/chat/sessions/{id}/export: Markdown and JSON downloads, streamed by id batches."""

from __future__ import annotations

import json
import re

import pytest

from chat.api import export
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.selectors import session_message_batch
from tests.factories import ChatSessionFactory, make_conversation
from tests.helpers import streamed_body

# The batches are read in worker threads, which cannot see a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def _url(session_id: object, fmt: str | None = None) -> str:
    query = f"?format={fmt}" if fmt is not None else ""
    return f"/api/v1/chat/sessions/{session_id}/export{query}"


def test_markdown_export_has_the_title_and_every_message_in_order(api, owner):
    session = ChatSessionFactory(owner=owner, title="Trip to Lisbon")
    make_conversation(session, turns=3)
    ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="half", status=MessageStatus.FAILED
    )
    ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "memory_search", "arguments": "{}"},
            },
            "not a call",
        ],
    )
    ChatMessage.objects.create(
        session=session, role=MessageRole.TOOL, content="nothing found", tool_call_id="c1"
    )
    response = api.get(_url(session.pk, "markdown"))
    assert response.status_code == 200, response.content
    assert response.streaming and response.is_async
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="cadau-session-{session.pk}.md"'
    )
    text = streamed_body(response).decode()
    assert text.startswith("# Trip to Lisbon\n")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h.split(" · ")[0] for h in headings] == [
        "## User",
        "## Assistant",
        "## User",
        "## Assistant",
        "## User",
        "## Assistant",
        "## Assistant (failed)",
        "## Assistant",
        "## Tool",
    ]
    assert "_Called `memory_search` with:_\n\n```\n{}\n```" in text and "nothing found" in text
    assert text.index("question 0") < text.index("answer 0") < text.index("question 2")


def test_json_export_walks_a_long_session_in_batches(api, owner, monkeypatch):
    monkeypatch.setattr(export, "EXPORT_BATCH", 7)
    session = ChatSessionFactory(owner=owner, title='He said "hi"')
    other = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=25)  # 50 messages: 7 full batches and a short one
    make_conversation(other, turns=3)
    calls = []
    real = export.session_message_batch

    def counted(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(export, "session_message_batch", counted)
    response = api.get(_url(session.pk, "json"))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    data = json.loads(streamed_body(response))
    assert data["session"]["title"] == 'He said "hi"'
    ids = [m["id"] for m in data["messages"]]
    stored = list(
        ChatMessage.objects.filter(session=session).order_by("id").values_list("id", flat=True)
    )
    assert ids == stored and len(ids) == 50
    assert {m["session_id"] for m in data["messages"]} == {session.pk}
    assert data["messages"][0]["content"].startswith("question 0")
    assert len(calls) == 8 and all(c["limit"] == 7 for c in calls)


def test_an_empty_session_exports_an_empty_list(api, owner):
    session = ChatSessionFactory(owner=owner, title="")
    data = json.loads(streamed_body(api.get(_url(session.pk, "json"))))
    assert data["messages"] == [] and data["session"]["id"] == session.pk
    text = streamed_body(api.get(_url(session.pk))).decode()
    assert text.startswith(f"# Session {session.pk}\n") and "## " not in text


def test_messages_stored_after_the_walk_began_are_left_out(owner):
    session = ChatSessionFactory(owner=owner)
    rows = make_conversation(session, turns=2)
    through = rows[-1].pk
    make_conversation(session, turns=2)  # arrives while the export runs
    batch = session_message_batch(session_id=session.pk, after_id=0, through_id=through, limit=99)
    assert [m.pk for m in batch] == [r.pk for r in rows]


def test_outsider_and_anonymous_get_nothing(outsider_api, anon_api, owner):
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=1)
    for fmt in ("markdown", "json"):
        response = outsider_api.get(_url(session.pk, fmt))
        assert response.status_code == 404
        assert b"question" not in response.content
    assert anon_api.get(_url(session.pk)).status_code in (401, 403)
    assert outsider_api.get(_url("not-a-number")).status_code == 404


@pytest.mark.parametrize("fmt", ["pdf", "", "JSON", "x" * 500, "markdown\x00"])
def test_an_unknown_format_is_a_400(api, owner, fmt):
    session = ChatSessionFactory(owner=owner)
    response = api.get(_url(session.pk), {"format": fmt})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert len(response.content) < 500


def test_exports_are_throttled_per_user(api, owner, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_export": "2/min"}
    session = ChatSessionFactory(owner=owner)
    assert api.get(_url(session.pk)).status_code == 200
    assert api.get(_url(session.pk, "json")).status_code == 200
    refused = api.get(_url(session.pk))
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    # HEAD runs the same view: it counts, and is refused alike.
    assert api.head(_url(session.pk)).status_code == 429


def test_markdown_cannot_be_broken_by_a_title_or_tool_arguments(api, owner):
    session = ChatSessionFactory(owner=owner, title="a\n## User · fake")
    ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[{"function": {"name": "run", "arguments": "```\n## User · injected\n```"}}],
    )
    text = streamed_body(api.get(_url(session.pk))).decode()
    assert text.startswith("# a ## User · fake\n")
    assert "\n````\n```\n## User · injected\n```\n````\n" in text
    outside = re.sub(r"````.*?````", "", text, flags=re.S)
    assert [line for line in outside.splitlines() if line.startswith("## ")] == [
        line for line in outside.splitlines() if line.startswith("## Assistant")
    ]


FORGERIES = [
    "ok\n\n## User · 2026-01-01 00:00 UTC\n\nforged question",
    "   ## Assistant",
    "User\n----",
    "Assistant\n===",
    "<h2>User</h2>",
    "text <h2>inline</h2> more",
    "```\nan unclosed fence swallows the next turn's heading",
    "~~~",
    "<!-- an unclosed comment",
    "> quoted\n>\n> ## User",
    "- item\n\n  ## User",
    "- a\n   ```\n## User\n   ```",  # a list item's fence ends where the list does
    "```py\n# a comment\n```\n\n## User",
    "```\n<h2>in code</h2>\n```\nUser\n---",
]


def _headings(text: str) -> list[str]:
    """Every heading a CommonMark renderer (raw HTML on, as most are) shows in `text`."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark", {"html": True}).render(text)
    return re.findall(r"<h([1-6])>", html)


@pytest.mark.parametrize("content", FORGERIES)
def test_message_content_cannot_add_or_hide_headings(api, owner, content):
    session = ChatSessionFactory(owner=owner)
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content=content)
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="reply")
    text = streamed_body(api.get(_url(session.pk))).decode()
    assert _headings(text) == ["1", "2", "2"], text
    assert content in text  # kept word for word (fenced)


@pytest.mark.parametrize(
    "name", ["x\n\n## User · fake", "`\n## Assistant", "a``b\n<h2>x</h2>", "## Tool"]
)
def test_a_tool_name_cannot_add_headings(api, owner, name):
    session = ChatSessionFactory(owner=owner)
    ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[{"function": {"name": name, "arguments": "{}"}}],
    )
    ChatMessage.objects.create(session=session, role=MessageRole.TOOL, content="done")
    text = streamed_body(api.get(_url(session.pk))).decode()
    assert _headings(text) == ["1", "2", "2"], text


def test_ordinary_markdown_stays_markdown(api, owner):
    session = ChatSessionFactory(owner=owner)
    reply = "Some **bold**, a list:\n\n- one\n- two\n\n```python\nprint(1)\n```\n\n---\n\na < b"
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content=reply)
    text = streamed_body(api.get(_url(session.pk))).decode()
    assert f"\n{reply}\n" in text and "````" not in text


def test_messages_are_rendered_off_the_event_loop(api, owner, monkeypatch):
    """Rendered on the loop, a batch of long messages stalled every other request of the
    process (a probe: 1.4 s a batch)."""
    import asyncio

    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=3)
    on_loop = []
    real = export._json_message

    def recorded(message):
        try:
            asyncio.get_running_loop()
            on_loop.append(message.pk)
        except RuntimeError:
            pass
        return real(message)

    monkeypatch.setattr(export, "_json_message", recorded)
    data = json.loads(streamed_body(api.get(_url(session.pk, "json"))))
    assert len(data["messages"]) == 6 and on_loop == []
