"""The chat page in a real browser: login, send and stream, the bounded window, navigator,
edit-and-resend, stop/retry, sessions, XSS payloads, CSP, phone width and Chinese."""

from __future__ import annotations

import re
from typing import Any

from chat.management.commands.seed_demo import seed_session
from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login, screenshot
from tests.browser.xss_payloads import PAYLOADS

CAP = 150  # chat.web.views.WINDOW_CAP
MESSAGES = "[data-message-id]"

# Records the largest number of message elements the page ever held, after every DOM change.
MAX_COUNTER = """
window.__maxMessages = 0;
const list = document.getElementById('message-list');
if (list) new MutationObserver(() => {
  const n = document.querySelectorAll('[data-message-id]').length;
  if (n > window.__maxMessages) window.__maxMessages = n;
}).observe(list, {childList: true});
"""


def wait_js(page: Any, expression: str, timeout: float = 15_000) -> None:
    """wait_for_function with an expression is eval'd inside the page, which our CSP (no
    'unsafe-eval') rightly refuses; a function is injected through the devtools protocol."""
    page.wait_for_function(f"() => ({expression})", timeout=timeout)


def _assistant_last(page: Any) -> Any:
    return page.locator('[data-role="assistant"]').last


def _send(page: Any, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


def _wait_socket(page: Any) -> None:
    wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)


def test_login_new_chat_send_stream_and_ring(page: Any, app: LiveApp, user: Any) -> None:
    page.goto(app.url + "/")
    assert "/accounts/login/" in page.url
    screenshot(page, "01-login")
    login(page, app, user)
    # No sessions yet: the empty state, then "New chat" opens the session's own URL.
    assert page.locator("#empty-state").is_visible()
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    session_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert page.locator("textarea#composer-input").get_attribute("id") == "composer-input"
    assert page.locator("label[for=composer-input]").count() == 1
    _wait_socket(page)
    ring_before = float(page.get_attribute("#usage", "data-used-pct") or 0)

    reply = "Here is **bold** text and `code`.\n\n" + " ".join(f"word{i}" for i in range(40))
    app.fake.script({"content": reply, "token_ms": 25})
    # Shift+Enter is a new line, Enter sends.
    page.fill("#composer-input", "Hello there")
    page.press("#composer-input", "Shift+Enter")
    page.keyboard.type("second line")
    assert page.input_value("#composer-input") == "Hello there\nsecond line"
    page.press("#composer-input", "Enter")

    page.wait_for_selector('[data-role="user"][data-message-id]')
    streaming = page.wait_for_selector('[data-role="assistant"][data-status="streaming"]')
    wait_js(
        page,
        "document.querySelector('[data-role=assistant] .msg-body').textContent.includes('word')",
    )
    screenshot(page, "02-streaming")
    assert streaming.query_selector(".msg-body strong") is None  # plain text while streaming
    page.wait_for_selector('[data-role="assistant"][data-status="complete"] .msg-body strong')
    assert _assistant_last(page).locator(".msg-body code").inner_text() == "code"
    assert page.locator("[data-role=user] .msg-body").inner_text() == "Hello there\nsecond line"
    wait_js(page, f"Number(document.getElementById('usage').dataset.usedPct) > {ring_before}")
    assert page.get_attribute("#usage", "data-level") in {"ok", "warn", "danger"}
    assert "%" in (page.get_attribute("#ring-btn", "aria-label") or "")
    screenshot(page, "03-reply-done")

    # The socket drops: it comes back by itself and the next send streams as before.
    page.evaluate("cadau.socket.drop()")
    wait_js(page, "document.documentElement.dataset.socket === 'down'")
    _wait_socket(page)
    _send(page, "After the reconnect")
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant]')].some("
        "n => n.textContent.includes('Echo: After the reconnect'))",
    )
    # Reload keeps the session's URL and shows the same conversation.
    page.reload()
    page.wait_for_selector(MESSAGES)
    assert page.url.endswith(f"/chat/{session_id}/")
    assert page.locator(MESSAGES).count() == 4
    assert page.locator(".session.active").count() == 1


def test_long_session_pages_both_ways_under_the_cap(page: Any, app: LiveApp, user: Any) -> None:
    seeded = seed_session(user=user, messages=3000, title="Long one")
    ids = list(
        ChatMessage.objects.filter(session_id=seeded.session_id)
        .order_by("id")
        .values_list("id", flat=True)
    )
    page.add_init_script(
        "document.addEventListener('DOMContentLoaded', () => {" + MAX_COUNTER + "});"
    )
    login(page, app, user, next_path=f"/chat/{seeded.session_id}/")
    page.wait_for_selector(MESSAGES)
    assert int(page.locator(MESSAGES).last.get_attribute("data-message-id")) == ids[-1]
    screenshot(page, "04-long-session-newest")

    # Scroll anchoring: loading an older page above the viewport must not move what is on screen.
    probe = page.locator(MESSAGES).first
    probe_id = probe.get_attribute("data-message-id")
    page.evaluate("document.getElementById('messages').scrollTop = 0")
    wait_js(page, f"cadau.win.count > 50 && cadau.win.messages[0].id < {probe_id}")
    page.wait_for_timeout(100)
    top_after = page.evaluate(
        f"document.getElementById('m-{probe_id}').getBoundingClientRect().top"
    )
    box_top = page.evaluate("document.getElementById('messages').getBoundingClientRect().top")
    # The probe was the first message at scrollTop 0 (just below the padding): it stays there.
    assert abs(top_after - box_top) < 40, (top_after, box_top)

    # Up to the very first message.
    for _ in range(400):
        if page.evaluate("cadau.win.olderCursor === null"):
            break
        page.evaluate("document.getElementById('messages').scrollTop = 0")
        page.wait_for_timeout(40)
    page.wait_for_selector(f"#m-{ids[0]}")
    assert not page.evaluate("cadau.win.atLiveEdge")
    screenshot(page, "05-long-session-oldest")
    # And back down to the newest.
    for _ in range(400):
        if page.evaluate("cadau.win.atLiveEdge"):
            break
        page.evaluate("(b => b.scrollTop = b.scrollHeight)(document.getElementById('messages'))")
        page.wait_for_timeout(40)
    page.wait_for_selector(f"#m-{ids[-1]}")
    max_seen = page.evaluate("window.__maxMessages")
    assert 100 <= max_seen <= CAP
    assert page.locator(MESSAGES).count() <= CAP
    # Every element carries its id and role.
    roles = page.eval_on_selector_all(MESSAGES, "ns => ns.map(n => n.dataset.role)")
    assert set(roles) <= {"user", "assistant"}


def test_navigator_jumps_and_highlights(page: Any, app: LiveApp, user: Any) -> None:
    seeded = seed_session(user=user, messages=1200, title="Navigate me")
    login(page, app, user, next_path=f"/chat/{seeded.session_id}/")
    page.wait_for_selector(MESSAGES)
    page.click("#toggle-turns")
    page.wait_for_selector(".turn-link")
    assert page.get_attribute("#toggle-turns", "aria-expanded") == "true"
    target = page.locator(".turn-link").nth(150)  # 150 questions back: far outside the window
    target_id = int(target.get_attribute("data-target-id"))
    assert not page.locator(f"#m-{target_id}").count()
    target.click()
    page.wait_for_selector(f"#m-{target_id}.highlight")
    assert page.get_attribute(f"#m-{target_id}", "data-role") == "user"
    in_view = page.evaluate(
        f"""(() => {{
            const r = document.getElementById('m-{target_id}').getBoundingClientRect();
            const b = document.getElementById('messages').getBoundingClientRect();
            return r.bottom > b.top && r.top < b.bottom;
        }})()"""
    )
    assert in_view
    screenshot(page, "06-navigator-jump")
    assert page.locator(MESSAGES).count() <= CAP
    # Off the live edge: "new messages" takes you back to the newest.
    assert not page.evaluate("cadau.win.atLiveEdge")


def test_edit_and_resend(page: Any, app: LiveApp, user: Any) -> None:
    login(page, app, user)
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    _wait_socket(page)
    for text in ("first question", "second question"):
        _send(page, text)
        wait_js(
            page,
            "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
            f".some(n => n.textContent.includes('Echo: {text}'))",
        )
    assert page.locator(MESSAGES).count() == 4
    first_user = page.locator('[data-role="user"]').first
    first_user.hover()
    first_user.locator("[data-action=edit]").click()
    page.fill(".edit-input", "edited question")
    page.click(".edit-form button[type=submit]")
    # The dialog says what goes before anything does.
    page.wait_for_selector("dialog#app-dialog[open]")
    assert "3 messages after it" in page.inner_text("#dialog-text")
    page.click("#app-dialog [data-dialog=confirm]")
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('Echo: edited question'))",
    )
    texts = page.eval_on_selector_all(MESSAGES, "ns => ns.map(n => n.dataset.role)")
    assert texts == ["user", "assistant"]
    session = ChatSession.objects.get(owner=user)
    stored = list(session.messages.order_by("id").values_list("role", "content"))
    assert stored[0] == (MessageRole.USER, "edited question")
    assert len(stored) == 2


def test_stop_and_retry_a_reply(page: Any, app: LiveApp, user: Any) -> None:
    login(page, app, user)
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    _wait_socket(page)
    app.fake.script({"content": " ".join(f"slow{i}" for i in range(400)), "token_ms": 40})
    _send(page, "Tell me a long story")
    page.wait_for_selector('[data-role="assistant"][data-status="streaming"]')
    wait_js(
        page,
        "document.querySelector('[data-role=assistant] .msg-body').textContent.includes('slow3')",
    )
    assert page.locator("#stop-btn").is_visible()
    page.click("#stop-btn")
    page.wait_for_selector('[data-role="assistant"][data-status="cancelled"]')
    assert page.locator("#stop-btn").is_hidden()
    screenshot(page, "07-stopped")
    app.fake.script("The retried answer.")
    page.click('[data-role="assistant"] [data-action="retry"]')
    page.wait_for_selector('[data-role="assistant"][data-status="complete"]')
    assert "The retried answer." in _assistant_last(page).inner_text()
    assert page.locator('[data-role="assistant"]').count() == 1


def test_sessions_sidebar_rename_and_delete(page: Any, app: LiveApp, user: Any) -> None:
    older = ChatSession.objects.create(owner=user, title="Keep me")
    doomed = ChatSession.objects.create(owner=user, title="Delete me")
    for i in range(25):  # more than one sidebar page (20)
        ChatSession.objects.create(owner=user, title=f"Filler {i}")
    login(page, app, user, next_path=f"/chat/{doomed.pk}/")
    # The open chat is on the list's second page (25 chats are newer): scrolling down loads it.
    page.wait_for_selector(".session")
    page.evaluate("(b => b.scrollTop = b.scrollHeight)(document.getElementById('session-scroll'))")
    page.wait_for_selector(f'.session[data-session-id="{older.pk}"]')
    page.wait_for_selector(f'.session.active[data-session-id="{doomed.pk}"]')
    assert page.locator(".session").count() == 27

    page.click(f'.session[data-session-id="{doomed.pk}"] [data-action=rename]')
    page.fill("#dialog-input", "Renamed chat")
    page.press("#dialog-input", "Enter")
    wait_js(page, "document.getElementById('chat-title').textContent === 'Renamed chat'")
    page.click(f'.session[data-session-id="{doomed.pk}"] [data-action=delete]')
    page.click("#app-dialog [data-dialog=confirm]")
    # Deleting the open chat goes to "/" once the undo time is over, which opens the newest
    # remaining one.
    page.wait_for_url(lambda url: "/chat/" in url and not url.endswith(f"/chat/{doomed.pk}/"))
    page.wait_for_selector(".session.active")
    assert page.locator(f'.session[data-session-id="{doomed.pk}"]').count() == 0
    assert not ChatSession.objects.filter(pk=doomed.pk).exists()


def _dangerous_dom(page: Any) -> list[str]:
    return page.evaluate(
        """(() => {
          const bad = [];
          const root = document.getElementById('message-list');
          for (const n of root.querySelectorAll('*')) {
            const tag = n.tagName.toLowerCase();
            if (['script','iframe','object','embed','img','svg','math','form','input','style',
                 'link','meta','base','video','audio','frame','details'].includes(tag)
                && !n.closest('.msg-tool')) bad.push(tag);
            for (const a of n.attributes) {
              const attr = tag + '@' + a.name;
              if (/^on/i.test(a.name) || ['style', 'srcdoc'].includes(a.name)) bad.push(attr);
              if (/^\\s*(javascript|data|vbscript):/i.test(a.value)) bad.push(attr + '=' + a.value);
            }
          }
          return bad;
        })()"""
    )


def test_xss_payloads_render_inert(page: Any, app: LiveApp, user: Any) -> None:
    assert len(PAYLOADS) == 50
    session = ChatSession.objects.create(owner=user, title="XSS")
    # Stored messages (history path, server-rendered Markdown): one per payload and role.
    rows = []
    for payload in PAYLOADS:
        rows.append(ChatMessage(session=session, role=MessageRole.USER, content=payload))
        rows.append(ChatMessage(session=session, role=MessageRole.ASSISTANT, content=payload))
    ChatMessage.objects.bulk_create(rows)
    ChatSession.objects.filter(pk=session.pk).update(message_count=len(rows))
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector(MESSAGES)
    _wait_socket(page)
    # Live path: the model streams every payload (deltas, then the final render), and the user
    # types them too.
    app.fake.script("\n\n".join(PAYLOADS))
    _send(page, "\n".join(PAYLOADS))
    wait_js(
        page,
        "(() => { const n = [...document.querySelectorAll('[data-role=assistant]')].pop();"
        " return n.dataset.status === 'complete' && n.querySelector('.msg-body.markdown'); })()",
    )
    # Scroll through everything so every stored payload has been in the DOM.
    for _ in range(20):
        if page.evaluate("cadau.win.olderCursor === null"):
            break
        page.evaluate("document.getElementById('messages').scrollTop = 0")
        page.wait_for_timeout(80)
    page.mouse.move(400, 300)
    page.wait_for_timeout(300)
    assert page.evaluate("window.__xss") == 0
    assert page.evaluate("window.__cspViolations") == []
    assert _dangerous_dom(page) == []
    # The payload text is still there, as text.
    assert "<script>" in page.locator("#message-list").inner_text()
    screenshot(page, "08-xss-inert")


def test_csp_header_and_no_inline_code(page: Any, app: LiveApp, user: Any) -> None:
    session = ChatSession.objects.create(owner=user, title="CSP")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    response = page.request.get(f"{app.url}/chat/{session.pk}/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    html = response.text()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'src="' in tag or 'type="application/json"' in tag, tag
    assert not re.search(r"\son[a-z]+\s*=", html)
    assert not re.search(r"\sstyle\s*=", html)
    assert "<style" not in html


def test_phone_width_and_chinese(browser: Any, app: LiveApp, user: Any) -> None:
    seeded = seed_session(user=user, messages=60, title="手机")
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, locale="zh-CN", has_touch=True, is_mobile=True
    )
    try:
        page = ctx.new_page()
        login(page, app, user, next_path=f"/chat/{seeded.session_id}/")
        page.wait_for_selector(MESSAGES)
        assert page.get_attribute("html", "lang") == "zh-hans"
        assert page.locator("#send-btn").inner_text() == "发送"
        assert page.locator("#sidebar").bounding_box()["x"] < 0  # off-canvas
        assert page.locator("#composer-input").is_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390
        screenshot(page, "09-phone-zh")
        page.click("#open-sidebar")
        wait_js(page, "document.getElementById('sidebar').getBoundingClientRect().x >= 0")
        screenshot(page, "10-phone-sidebar")
    finally:
        ctx.close()
