"""Replies and daily notes rendered once per process, and bounded per request
(chat/rendered.py): the history's `render=html` pages render a finished reply the first time
it is asked for, again only when its text changed, and no more text per page than a bound."""

from __future__ import annotations

import time

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


def _reply(session, content, **fields):
    return ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content=content, **fields
    )


@pytest.mark.django_db
def test_a_finished_reply_is_rendered_once_and_again_when_its_text_changes(api, owner, renders):
    session = ChatSession.objects.create(owner=owner)
    reply = _reply(session, "**one** `x < 2`")
    first = _html(api, session)
    assert first == ["<p><strong>one</strong> <code>x &lt; 2</code></p>\n"]
    assert _html(api, session) == first and len(renders) == 1
    # Edited in the admin (or regenerated under its id): its new text is rendered.
    ChatMessage.objects.filter(pk=reply.pk).update(content="**two**")
    assert _html(api, session) == ["<p><strong>two</strong></p>\n"]
    assert renders == ["**one** `x < 2`", "**two**"]


@pytest.mark.django_db
def test_a_streaming_reply_is_not_rendered(api, owner, renders):
    # The page shows a streaming reply as text until it ends (static/chat/message-parts.js).
    session = ChatSession.objects.create(owner=owner)
    _reply(session, "so far", status=MessageStatus.STREAMING)
    assert _html(api, session) == [None]
    assert renders == []


@pytest.mark.django_db
def test_a_page_stops_rendering_after_its_time_newest_first(api, owner, renders, monkeypatch):
    """A probe and a review: reads of a page of long replies held the HTTP threads for
    seconds each, every read."""
    monkeypatch.setattr(rendered, "REPLY_RENDER_RUNES_MAX", 150)
    session = ChatSession.objects.create(owner=owner)
    for n in range(3):
        _reply(session, f"reply {n} " + "x" * 90)
    _reply(session, "y" * 151)  # over the reply's bound: never rendered, shown as text
    clock = iter([0.0, 0.1, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2])
    monkeypatch.setattr(rendered, "_clock", lambda: next(clock))
    # Started at 0.0; the newest reply (the long one) is skipped, reply 2 starts at 0.1, and
    # by reply 1 the page's 0.5 s are spent.
    assert [h is not None for h in _html(api, session)] == [False, False, True, False]
    monkeypatch.setattr(rendered, "_clock", lambda: 0.0)
    # Read again: what was rendered is kept, the rest is rendered now.
    assert [h is not None for h in _html(api, session)] == [True, True, True, False]
    assert len(renders) == 3


@pytest.mark.django_db
def test_a_reply_whose_html_is_too_big_is_rendered_once_and_shown_as_text(
    api, owner, renders, monkeypatch
):
    # An empty-celled table grows tenfold in HTML (a review: 980,000 characters).
    monkeypatch.setattr(rendered, "ENTRY_RUNES_MAX", 200)
    session = ChatSession.objects.create(owner=owner)
    table = "|a|b|\n|-|-|\n" + "|||\n" * 20
    _reply(session, table)
    assert _html(api, session) == _html(api, session) == [None]
    assert renders == [table]


def test_the_cache_keeps_what_its_bound_holds_newest_used_last_out(monkeypatch, renders):
    monkeypatch.setattr(rendered, "CACHE_RUNES_MAX", 25)
    monkeypatch.setattr(rendered, "_MARKER_RUNES", 1)  # entries count their own length
    monkeypatch.setattr(rendered, "ENTRY_RUNES_MAX", 20)

    def note(n: int, text: str) -> str:
        return rendered.note_html(agent_id="a", day=f"2026-01-0{n}", markdown=text)

    assert [note(n, f"m{n}") for n in (1, 2)] == ["<p>m1</p>\n", "<p>m2</p>\n"]  # 10 each
    note(1, "m1")  # used: 2 is now the oldest
    note(3, "m3")  # 30 > 25: 2 goes
    assert len(renders) == 3
    note(1, "m1")
    note(2, "m2")
    assert renders == ["m1", "m2", "m3", "m2"]
    # One whose HTML is past the entry's bound is rendered once, and shown as text.
    long = "y" * 30
    assert [note(4, long) for _ in range(2)] == [f"<pre>{long}</pre>\n"] * 2
    assert renders.count(long) == 1


def test_a_long_daily_note_is_shown_as_text(monkeypatch, renders):
    monkeypatch.setattr(rendered, "NOTE_RENDER_RUNES_MAX", 20)
    html = rendered.note_html(agent_id="a", day="2026-01-01", markdown="# <b>big</b> " * 3)
    assert html == "<pre>" + "# &lt;b&gt;big&lt;/b&gt; " * 3 + "</pre>\n"
    assert renders == []


@pytest.mark.parametrize(
    "text",
    [
        "\\(" * 20_000,  # the probe's: 6.4 s
        "\\(" * 600 + "x" * 600_000,
        ("\\( " + "y" * 1000) * 600,
        "- [ ] a\n" * 5_000,  # the probe's: 4.1 s
    ],
)
def test_texts_whose_rendering_grew_with_the_square_of_their_length(text):
    started = time.perf_counter()
    render_markdown(text)
    assert time.perf_counter() - started < 1.5  # 0.01-0.3 s here; 4-175 s before


def test_math_and_task_lists_within_their_bounds_still_render():
    many = "Let \\(x_i\\) be the $i$-th value.\n\n" * 150  # 600 delimiters
    assert render_markdown(many).count("<math") == 300
    assert "<math" not in render_markdown("$a$ " * 10_000)  # 1.8 MB of MathML before
    # "$$" lines closed off by headings: dollarmath walked the rest of the text from each (a
    # review: 1.5 s for 32,000 characters); display math in an ordinary reply still renders.
    walked = "$$ x\n#\n" * 300 + "a\n" * 12_000
    assert "<math" not in render_markdown(walked)
    shown = "Some text.\n\n$$\n\\int_0^1 x^2 dx = \\frac{1}{3}\n$$\n\n" * 20
    assert render_markdown(shown).count("<math") == 20
    assert render_markdown("- [x] a\n" * 200).count('type="checkbox"') == 200
    assert 'type="checkbox"' not in render_markdown("- [x] a\n" * 201)
