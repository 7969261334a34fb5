"""The chat page's server side: views, CSP, offline banner, i18n, Markdown rendering and the
history API's `render=html`. (The page's behaviour in a browser: tests/browser/.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from chat.middleware import CONTENT_SECURITY_POLICY
from chat.models import Agent, ChatMessage, ChatSession, MessageRole
from chat.rendering import render_markdown
from tests.browser.xss_payloads import PAYLOADS

pytestmark = pytest.mark.django_db


def test_pages_need_login(client: Client) -> None:
    for path in ("/", "/chat/1/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    login = client.get("/accounts/login/")
    assert login.status_code == 200
    assert b'id="id_username"' in login.content


def test_home_opens_the_newest_session_or_the_empty_state(web: Client, owner) -> None:
    empty = web.get("/")
    assert empty.status_code == 200
    assert b'id="empty-state"' in empty.content
    ChatSession.objects.create(owner=owner, title="old")
    newest = ChatSession.objects.create(owner=owner, title="new")
    response = web.get("/")
    assert response.status_code == 302
    assert response["Location"] == f"/chat/{newest.pk}/"


def test_session_page_and_ownership(web: Client, owner, outsider) -> None:
    mine = ChatSession.objects.create(owner=owner, title="Mine <b>x</b>")
    theirs = ChatSession.objects.create(owner=outsider)
    response = web.get(f"/chat/{mine.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="composer-input"' in html and '<label for="composer-input"' in html
    assert "Mine &lt;b&gt;x&lt;/b&gt;" in html  # autoescaped
    assert 'id="cadau-config" type="application/json"' in html
    assert web.get(f"/chat/{theirs.pk}/").status_code == 404
    assert web.get("/chat/999999/").status_code == 404


def test_csp_on_html_not_on_json(web: Client, owner) -> None:
    session = ChatSession.objects.create(owner=owner)
    page = web.get(f"/chat/{session.pk}/")
    assert page["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    html = page.content.decode()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'src="' in tag or 'type="application/json"' in tag
    assert not re.search(r"\son[a-z]+\s*=|\sstyle\s*=|<style", html)
    api = web.get("/api/v1/chat/sessions")
    assert "Content-Security-Policy" not in api


def test_offline_banner(web: Client, owner, settings) -> None:
    session = ChatSession.objects.create(owner=owner)
    settings.LLM_BASE_URL = ""
    assert b'id="offline-banner"' in web.get(f"/chat/{session.pk}/").content
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"
    assert b'id="offline-banner"' not in web.get(f"/chat/{session.pk}/").content


def test_simplified_chinese_from_the_browser(web: Client, owner) -> None:
    session = ChatSession.objects.create(owner=owner)
    html = web.get(f"/chat/{session.pk}/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").content
    text = html.decode()
    assert '<html lang="zh-hans">' in text
    assert "发送" in text and "新对话" in text
    assert '"you": "\\u4f60"' in text or '"you": "你"' in text  # the JS catalog too
    english = web.get(f"/chat/{session.pk}/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert ">Send<" in english


def test_search_box_and_its_strings(web: Client, owner) -> None:
    """The sidebar's search box (static/chat/search.js) on both pages, in both languages."""
    empty = web.get("/").content.decode()
    session = ChatSession.objects.create(owner=owner)
    english = web.get(f"/chat/{session.pk}/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    for html in (empty, english):
        assert '<label for="search-input"' in html and 'id="search-input"' in html
        assert 'id="search-list" role="listbox"' in html and 'id="search-more"' in html
    assert 'placeholder="Search messages"' in english and ">More results<" in english
    assert _page_config(english)["strings"]["search_none"] == "No messages found."
    chinese = web.get(f"/chat/{session.pk}/", HTTP_ACCEPT_LANGUAGE="zh-CN").content.decode()
    assert 'placeholder="搜索消息"' in chinese and ">更多结果<" in chinese
    strings = _page_config(chinese)["strings"]
    assert strings["search_none"] == "没有找到消息。"
    assert strings["search_throttled_in"] == "搜索过于频繁，请在 %(seconds)s 秒后重试。"
    # Every search string is translated.
    search_keys = [key for key in strings if key.startswith("search_")]
    english_strings = _page_config(english)["strings"]
    assert len(search_keys) >= 7
    assert all(strings[key] != english_strings[key] for key in search_keys)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


SAFE_TAGS = {"p", "br", "strong", "em", "s", "code", "pre", "blockquote", "a", "table", "thead"}
SAFE_TAGS |= {"tbody", "tr", "th", "td", "ul", "ol", "li", "h1", "h2", "h3", "hr", "del"}
# Code colouring's token spans, task-list boxes and math (tests/chat/test_rendering.py).
SAFE_TAGS |= {"span", "div", "label", "input", "math", "semantics", "annotation", "mrow", "mi"}


@pytest.mark.parametrize("payload", PAYLOADS)
def test_render_markdown_neutralises(payload: str) -> None:
    parser = _Tags()
    parser.feed(render_markdown(payload))
    for tag, attrs in parser.found:
        assert tag in SAFE_TAGS, tag
        for name, value in attrs:
            assert name in {"href", "title", "class", "rel", "start"}, name
            assert not re.match(r"\s*(javascript|data|vbscript):", value or "", re.IGNORECASE)


def test_render_markdown_features() -> None:
    html = render_markdown("# T\n\n**b** `c`\n\n```python\nx = 1 < 2\n```\n\n[l](https://e.org)")
    assert "<h1>T</h1>" in html and "<strong>b</strong>" in html and "<code>c</code>" in html
    assert '<code class="language-python"><span class="hl-n">x</span>' in html
    assert '<span class="hl-o">&lt;</span>' in html
    assert 'href="https://e.org"' in html and 'rel="noopener nofollow noreferrer"' in html


def test_history_render_html(api, owner) -> None:
    session = ChatSession.objects.create(owner=owner)
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="**hi**")
    plain = api.get("/api/v1/chat/history", {"session_id": session.pk}).json()
    assert "content_html" not in plain["messages"][0]
    rendered = api.get("/api/v1/chat/history", {"session_id": session.pk, "render": "html"}).json()
    assert rendered["messages"][0]["content_html"] == "<p><strong>hi</strong></p>\n"
    bad = api.get("/api/v1/chat/history", {"session_id": session.pk, "render": "pdf"})
    assert bad.status_code == 400
    # Only replies: the page shows the rest as text, and rendering costs with the text.
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="**me**")
    rendered = api.get("/api/v1/chat/history", {"session_id": session.pk, "render": "html"}).json()
    assert [("content_html" in m) for m in rendered["messages"]] == [True, False]


def test_bracket_heavy_text_renders_without_link_syntax_in_bounded_time() -> None:
    """A probe: 48,000 "[" took 3 s to render ("![" 4 s), on every history read."""
    import time

    for text in ("[" * 48_000, "![" * 24_000):
        started = time.perf_counter()
        html = render_markdown(text)
        assert time.perf_counter() - started < 1.0  # ~0.09 s here; 3-4 s with link rules
        assert html.startswith("<p>" + text[:10])
    # Under the bound, links are links.
    assert 'noreferrer">l</a>' in render_markdown("[l](https://e.org) " + "[" * 400)
    over = render_markdown("[l](https://e.org) " + "[" * 600)
    assert 'noreferrer">l</a>' not in over and "[l](" in over  # the URL alone is linked


def _page_config(html: str) -> dict[str, Any]:
    block = re.search(r'<script id="cadau-config"[^>]*>(.*?)</script>', html, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_page_config_carries_the_sessions_threshold(web: Client, owner, settings) -> None:
    default = settings.CHAT_CONTEXT.threshold_pct
    assert _page_config(web.get("/").content.decode())["context_threshold_pct"] == default
    plain = ChatSession.objects.create(owner=owner)
    page = web.get(f"/chat/{plain.pk}/").content.decode()
    assert _page_config(page)["context_threshold_pct"] == default
    agent = Agent.objects.create(
        owner=owner, name="Terse", config_json={"context": {"threshold_pct": 50, "target_pct": 30}}
    )
    session = ChatSession.objects.create(owner=owner, agent=agent)
    page = web.get(f"/chat/{session.pk}/").content.decode()
    assert _page_config(page)["context_threshold_pct"] == 50


def test_every_chat_module_is_preloaded(web: Client, owner) -> None:
    """app.js's imports are preloaded in parallel; a module missing here would be fetched only
    once the module importing it has been parsed."""
    session = ChatSession.objects.create(owner=owner)
    html = web.get(f"/chat/{session.pk}/").content.decode()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/static/chat/([\w.-]+)">', html))
    static = Path(__file__).resolve().parents[2] / "static" / "chat"
    modules = {p.name for p in static.glob("*.js")}
    # agents.js is the agents page's entry point, not the chat page's; the dialogs and the
    # editor load on first use (import()), and no preloaded module imports them statically.
    lazy = {"dialog.js", "edit.js", "plain.js"}
    assert preloaded == modules - {"app.js", "agents.js"} - lazy
    for name in preloaded | {"app.js"}:
        text = (static / name).read_text()
        assert not re.search(r'^import [^;]* from "\./(dialog|edit|plain)\.js"', text, re.M), name
