"""The search box in the chat page's sidebar (static/chat/search.js): results as you type with
the matches marked, short Chinese queries and "More results", the keyboard, the API's errors,
opening a hit in a long session (in another chat and in the open one) inside the bounded
window, untrusted text shown as text, and phone width in Chinese."""

from __future__ import annotations

import json
import re
from typing import Any

from chat.models import ChatMessage, ChatSession, MessageRole
from chat.web.views import WINDOW_CAP
from tests.browser.conftest import LiveApp, login, screenshot
from tests.browser.test_chat_page import MAX_COUNTER, wait_js

MESSAGES = "[data-message-id]"
HITS = "#search-list .search-hit"
NEEDLE = "needle-7731"


def _chat(user: Any, title: str, contents: list[str]) -> tuple[ChatSession, list[int]]:
    """A session holding `contents` in order, user and assistant taking turns."""
    session = ChatSession.objects.create(owner=user, title=title)
    roles = (MessageRole.USER, MessageRole.ASSISTANT)
    ChatMessage.objects.bulk_create(
        ChatMessage(session=session, role=roles[i % 2], content=text)
        for i, text in enumerate(contents)
    )
    ChatSession.objects.filter(pk=session.pk).update(message_count=len(contents))
    ids = list(session.messages.order_by("id").values_list("id", flat=True))
    return session, ids


def _long_chat(user: Any, *, hit_at: int, total: int = 600) -> tuple[ChatSession, list[int]]:
    contents = [f"filler message {i} about nothing in particular" for i in range(total)]
    contents[hit_at] = f"The deploy key is {NEEDLE}, keep it out of the logs."
    return _chat(user, "Long one", contents)


def _in_view(page: Any, message_id: int) -> bool:
    return page.evaluate(
        f"""(() => {{
            const r = document.getElementById('m-{message_id}').getBoundingClientRect();
            const b = document.getElementById('messages').getBoundingClientRect();
            return r.top >= b.top - 1 && r.top < b.bottom && r.bottom > b.top;
        }})()"""
    )


def _marks(page: Any) -> list[str]:
    return page.eval_on_selector_all(f"{HITS} mark", "ns => ns.map(n => n.textContent)")


def _assert_hit_shown(page: Any, message_id: int, newest_id: int) -> None:
    """The hit is in the window, on screen and highlighted; the window is not the newest page
    and never held more than the cap."""
    page.wait_for_selector(f"#m-{message_id}.highlight")
    assert _in_view(page, message_id)
    assert page.locator(f"#m-{newest_id}").count() == 0
    assert page.locator(MESSAGES).count() <= WINDOW_CAP
    assert page.evaluate("cadau.win.count") <= WINDOW_CAP
    assert page.evaluate("window.__maxMessages") <= WINDOW_CAP


def test_type_see_marked_results_and_open_a_hit_in_another_long_chat(
    page: Any, app: LiveApp, user: Any
) -> None:
    long_chat, long_ids = _long_chat(user, hit_at=40)
    here, _ = _chat(user, "Open one", ["hello", "hi, how can I help?"])
    page.add_init_script(
        "document.addEventListener('DOMContentLoaded', () => {" + MAX_COUNTER + "});"
    )
    searches: list[str] = []
    page.on("request", lambda r: searches.append(r.url) if "/api/v1/chat/search" in r.url else None)
    login(page, app, user, next_path=f"/chat/{here.pk}/")
    page.wait_for_selector(MESSAGES)

    page.click("#search-input")
    page.keyboard.type(NEEDLE, delay=30)  # keystrokes faster than the pause: one request
    page.wait_for_selector(HITS)
    assert _marks(page) == [NEEDLE]
    hit = page.locator(HITS).first
    assert hit.locator(".search-hit-title").inner_text() == "Long one"
    assert hit.locator(".search-hit-role").inner_text() == "You"
    assert hit.locator("time").count() == 1
    assert "keep it out of the logs" in hit.locator(".search-snippet").inner_text()
    assert len(searches) == 1, searches
    # The chat list makes room for the results while a query is in the box.
    assert page.locator("#session-scroll").is_hidden()
    screenshot(page, "search")

    # Arrow down, Enter: the other chat opens around the hit, far above its newest page.
    page.keyboard.press("ArrowDown")
    assert hit.get_attribute("aria-selected") == "true"
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"/chat/{long_chat.pk}/\?m={long_ids[40]}$"))
    _assert_hit_shown(page, long_ids[40], long_ids[-1])
    page.wait_for_timeout(700)  # the highlight's fade-in
    screenshot(page, "search-open")
    assert page.get_attribute(f"#m-{long_ids[40]}", "data-role") == "user"
    # The same results are still in the sidebar, the opened one marked.
    page.wait_for_selector(f'#search-hit-{long_ids[40]}[aria-current="true"]')
    assert page.input_value("#search-input") == NEEDLE

    # Back to the newest through the "new messages" button: the window moves, still capped.
    page.click("#new-messages")
    page.wait_for_selector(f"#m-{long_ids[-1]}")
    assert page.locator(MESSAGES).count() <= WINDOW_CAP


def test_a_hit_in_the_open_chat_moves_the_window_in_place(
    page: Any, app: LiveApp, user: Any
) -> None:
    session, ids = _long_chat(user, hit_at=120)
    page.add_init_script(
        "document.addEventListener('DOMContentLoaded', () => {" + MAX_COUNTER + "});"
    )
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector(f"#m-{ids[-1]}")
    url = page.url
    page.fill("#search-input", NEEDLE)
    page.click(f"#search-hit-{ids[120]}")
    _assert_hit_shown(page, ids[120], ids[-1])
    assert page.url == url  # no page load


def test_short_chinese_query_more_results_and_no_results(
    page: Any, app: LiveApp, user: Any
) -> None:
    contents = []
    for i in range(50):
        contents.append(f"第{i}次：我们把数据库迁移到 PostgreSQL 了" if i % 2 == 0 else "好的")
    _chat(user, "数据库迁移", contents)
    login(page, app, user)
    page.wait_for_selector(MESSAGES)
    page.fill("#search-input", "数据")  # two characters: the bounded scan
    page.wait_for_function("() => document.querySelectorAll('#search-list .search-hit').length")
    assert page.locator(HITS).count() == 20
    assert set(_marks(page)) == {"数据"}
    assert page.locator(HITS).first.locator(".search-hit-title").inner_text() == "数据库迁移"
    # Newest first: 第48次 is the newest match.
    assert "第48次" in page.locator(HITS).first.inner_text()
    assert page.locator("#search-more").is_visible()
    page.click("#search-more")
    wait_js(page, "document.querySelectorAll('#search-list .search-hit').length === 25")
    assert "第0次" in page.locator(HITS).last.inner_text()
    wait_js(page, "document.getElementById('search-more').hidden")

    page.fill("#search-input", "不存在的词语")
    page.wait_for_selector('#search-status[data-kind="empty"]')
    assert page.locator(HITS).count() == 0
    assert page.inner_text("#search-status") == "No messages found."

    # An empty box clears the results and brings the chat list back.
    page.fill("#search-input", "")
    wait_js(page, "document.getElementById('search-results').hidden")
    assert page.locator("#session-scroll").is_visible()


def test_keyboard_shortcuts_arrows_and_escape(page: Any, app: LiveApp, user: Any) -> None:
    _chat(user, "Keys", [f"keyword number {i}" for i in range(6)])
    login(page, app, user)
    page.wait_for_selector(MESSAGES)
    # The page starts in the composer: "/" is a character there, Ctrl+K still searches.
    assert page.evaluate("document.activeElement.id") == "composer-input"
    page.keyboard.press("/")
    assert page.input_value("#composer-input") == "/"
    page.keyboard.press("Control+k")
    assert page.evaluate("document.activeElement.id") == "search-input"
    # Away from any input, "/" focuses the box.
    page.click("#chat-title")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "search-input"
    assert page.input_value("#search-input") == ""
    page.keyboard.type("keyword")
    wait_js(page, "document.querySelectorAll('#search-list .search-hit').length === 6")
    for _ in range(3):
        page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowUp")
    selected = page.locator(f'{HITS}[aria-selected="true"]')
    assert selected.count() == 1
    assert page.get_attribute("#search-input", "aria-activedescendant") == selected.get_attribute(
        "id"
    )
    assert "keyword number 4" in selected.inner_text()  # newest first: 5, 4, 3 -> back to 4
    # Esc clears and leaves the box; the chat list is back.
    page.keyboard.press("Escape")
    assert page.input_value("#search-input") == ""
    assert page.evaluate("document.activeElement.id") != "search-input"
    assert page.locator("#search-results").is_hidden()
    assert page.locator("#session-scroll").is_visible()
    # Meta+K (macOS) as well.
    page.keyboard.press("Meta+k")
    assert page.evaluate("document.activeElement.id") == "search-input"


def test_untrusted_text_in_results_is_text(page: Any, app: LiveApp, user: Any) -> None:
    payload = "look <img src=x onerror=window.__xss++> and <script>alert(1)</script> here"
    _chat(user, "<b>bold title</b>", [payload, "ok"])
    login(page, app, user)
    page.wait_for_selector(MESSAGES)
    page.fill("#search-input", "onerror")
    page.wait_for_selector(HITS)
    assert _marks(page) == ["onerror"]
    results = page.locator("#search-list")
    assert "<img src=x onerror=window.__xss++>" in results.inner_text()
    assert page.locator(HITS).first.locator(".search-hit-title").inner_text() == "<b>bold title</b>"
    assert page.locator("#search-list img, #search-list script, #search-list b").count() == 0
    page.wait_for_timeout(200)
    assert page.evaluate("window.__xss") == 0
    assert page.evaluate("window.__cspViolations") == []


def test_api_errors_and_stale_answers(page: Any, app: LiveApp, user: Any) -> None:
    _chat(user, "Errors", ["fresh answer text", "ok"])
    login(page, app, user)
    page.wait_for_selector(MESSAGES)
    held: list[Any] = []

    def answer(route: Any) -> None:
        q = re.search(r"[?&]q=([^&]*)", route.request.url)
        query = q.group(1) if q else ""
        if query == "busy":
            route.fulfill(
                status=429,
                headers={"Retry-After": "17"},
                content_type="application/json",
                body=json.dumps({"error": {"code": "throttled", "message": "Slow down."}}),
            )
        elif query == "slowpoke":
            route.fulfill(
                status=503,
                content_type="application/json",
                body=json.dumps({"error": {"code": "search_timeout", "message": "Too slow."}}),
            )
        elif query == "bad":
            route.fulfill(
                status=400,
                content_type="application/json",
                body=json.dumps({"error": {"code": "invalid", "message": "q: not like that."}}),
            )
        elif query == "stale":
            held.append(route)  # answered later, after a newer query's results
        else:
            route.continue_()

    page.route("**/api/v1/chat/search?*", answer)
    page.fill("#search-input", "busy")
    page.wait_for_selector('#search-status[data-kind="error"]')
    assert page.inner_text("#search-status") == "Too many searches; try again in 17 s."
    page.fill("#search-input", "slowpoke")
    wait_js(page, "document.getElementById('search-status').textContent.includes('too long')")
    page.fill("#search-input", "bad")
    wait_js(page, "document.getElementById('search-status').textContent.includes('not like')")
    assert page.inner_text("#search-status") == "Error: q: not like that."

    # A query whose answer is late: the next keystroke cancels it, and when it does arrive it
    # changes nothing.
    page.fill("#search-input", "stale")
    wait_js(page, "document.getElementById('search-status').dataset.kind === 'searching'")
    page.wait_for_timeout(100)
    assert len(held) == 1
    page.fill("#search-input", "fresh")
    page.wait_for_selector(HITS)
    fake = {
        "results": [
            {
                "session_id": 1,
                "session_title": "STALE",
                "message_id": 1,
                "role": "user",
                "created_at": "2026-01-01T00:00:00Z",
                "snippet": "stale",
                "highlights": [[0, 5]],
            }
        ],
        "next_cursor": None,
        "mode": "index",
    }
    assert held[0].request.failure == "net::ERR_ABORTED"  # cancelled by the next keystroke
    held[0].fulfill(status=200, content_type="application/json", body=json.dumps(fake))
    page.wait_for_timeout(200)
    assert "STALE" not in page.inner_text("#search-list")
    assert _marks(page) == ["fresh"]


def test_phone_width_in_chinese(browser: Any, app: LiveApp, user: Any) -> None:
    session, ids = _chat(
        user,
        "手机上的搜索",
        [f"第{i}条：{'缓存失效了' if i == 3 else '普通的消息'}" for i in range(80)],
    )
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, locale="zh-CN", has_touch=True, is_mobile=True
    )
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        login(page, app, user, next_path=f"/chat/{session.pk}/")
        page.wait_for_selector(f"#m-{ids[-1]}")
        assert page.locator("#sidebar").bounding_box()["x"] < 0  # off-canvas
        page.click("#chat-title")
        page.keyboard.press("/")  # opens the sidebar to reach the box
        wait_js(page, "document.getElementById('sidebar').getBoundingClientRect().x >= 0")
        assert page.evaluate("document.activeElement.id") == "search-input"
        assert page.get_attribute("#search-input", "placeholder") == "搜索消息"
        page.keyboard.type("缓存")
        page.wait_for_selector(HITS)
        assert _marks(page) == ["缓存"]
        assert page.locator(HITS).first.locator(".search-hit-role").inner_text() == "助手"
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.evaluate("document.getElementById('sidebar').scrollWidth") <= 390
        screenshot(page, "search-phone-zh")
        # A hit in this chat: the sidebar closes and the message shows, highlighted.
        page.click(f"#search-hit-{ids[3]}")
        wait_js(page, "document.getElementById('sidebar').getBoundingClientRect().right <= 0")
        page.wait_for_selector(f"#m-{ids[3]}.highlight")
        assert _in_view(page, ids[3])
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert not errors, errors
    finally:
        ctx.close()
