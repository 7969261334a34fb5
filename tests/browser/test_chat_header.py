"""The chat header (templates/chat/chat.html, static/chat/header.js): the agent's name and
model, the "Memory updated" chip, the ring's panel with Compact now, and at 390 px the ⋯ menu
with 44 px tap targets and a readable title. Then the agent's page: its daily note rendered,
its entries titled in the user's words. English on a desktop and Chinese on a 390 px phone."""

from __future__ import annotations

from typing import Any

from chat.models import Agent, ChatSession
from tests.browser.conftest import (
    LiveApp,
    login,
    say,
    screenshot,
    send_message,
    wait_js,
    wait_socket,
)

# Every control a finger can reach in the chat's header, composer and messages (and in the
# ⋯ menu when open) that is smaller than 44 x 44 px.
SMALL_TARGETS = """(() => {
  const small = [];
  const scope = [
    '.chat-head', '.composer', '#message-list', '#head-tools.open', '.layout.sidebar-open .sidebar',
  ].join(', ');
  const controls = ':is(button, a, summary, select, textarea, input)';
  for (const n of document.querySelectorAll(`:is(${scope}) ${controls}`)) {
    const r = n.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(n).visibility === 'hidden') continue;
    const size = `${Math.round(r.width)}x${Math.round(r.height)}`;
    if (r.width < 44 || r.height < 44) small.push(`${n.id || n.className || n.tagName} ${size}`);
  }
  return small;
})()"""


def test_agent_header_memory_chip_and_the_agents_page(
    variant_page: Any, app: LiveApp, user: Any
) -> None:
    page = variant_page
    name = say(page, "Researcher", "研究员")
    agent = Agent.objects.create(
        owner=user, name=name, model="", config_json={"memory_auto_append": True}
    )
    session = ChatSession.objects.create(owner=user, agent=agent, title="Memory")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    assert page.inner_text("#chat-agent-name") == name
    assert page.inner_text("#chat-agent-model") == "fake-chat"
    wait_socket(page)
    fact = say(page, "the deploy window is Tuesday 14:00 UTC", "部署窗口是周二下午两点")
    send_message(page, say(page, f"Remember that {fact}.", f"请记住：{fact}。"))
    chip = page.wait_for_selector("[data-role=user] .memory-chip")
    assert chip.inner_text() == say(page, "Memory updated", "记忆已更新")
    page.wait_for_selector("[data-role=assistant][data-status=complete]")
    screenshot(page, f"27-memory-chip-{page.variant}")
    # The chip opens the agent's memory, where the entry is titled in the user's words.
    chip.click()
    page.wait_for_selector("#memory-panel:not([hidden]) .memory-entry")
    assert fact[:10] in page.inner_text("#memory-list strong")

    page.goto(f"{app.url}/agents/{agent.pk}/")
    wait_js(page, "document.querySelector('#daily-note strong') !== null")
    note = page.inner_text("#daily-note")
    assert fact in note and "(#" not in note and "cadau:" not in note and "**" not in note
    page.wait_for_selector(".entry-title")
    assert page.inner_text(".entry-title").startswith(fact[:10])
    screenshot(page, f"27-agent-page-{page.variant}")


def test_ring_panel_says_what_the_number_means(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    session = ChatSession.objects.create(owner=user, title="Ring")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    if not page.phone:
        page.hover("#ring-btn")
        wait_js(page, "getComputedStyle(document.getElementById('ring-tip')).opacity === '1'")
    tip = page.text_content("#ring-tip") or ""
    assert say(page, "characters", "字符") in tip
    assert say(page, "Click for what it means", "点击查看它的含义") in tip
    assert page.locator("#ring-panel").is_hidden()
    page.click("#ring-btn")
    page.wait_for_selector("#ring-panel:not([hidden])")
    assert page.get_attribute("#ring-btn", "aria-expanded") == "true"
    assert say(page, "The model is sent", "发送给模型") in page.inner_text("#ring-now")
    assert "88%" in page.inner_text("#ring-auto")
    assert say(page, "Every message stays", "所有消息仍保留") in page.inner_text("#ring-panel")
    assert page.locator("#compact-now").is_visible()
    panel = page.locator("#ring-panel").bounding_box()
    width = page.viewport_size["width"]
    assert panel is not None and panel["x"] >= 0 and panel["x"] + panel["width"] <= width
    screenshot(page, f"27-ring-panel-{page.variant}")
    page.keyboard.press("Escape")
    page.wait_for_selector("#ring-panel", state="hidden")
    assert page.evaluate("document.activeElement.id") == "ring-btn"
    # Compact now, from the panel, on a phone as on a desktop.
    page.click("#ring-btn")
    page.click("#compact-now")
    page.wait_for_selector("#notice:not([hidden])")
    # A new chat has nothing to fold in: the notice says so, not an error.
    wait_js(page, "!document.getElementById('notice').textContent.includes('…')")
    assert page.get_attribute("#notice", "data-level") != "error"
    said = page.inner_text("#notice")
    assert any(w in said for w in (("没有", "未压缩") if page.lang == "zh" else ("Nothing",)))


def test_phone_header_menu_targets_and_title(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    title = say(page, "Planning a weekend in Porto", "计划波尔图周末行程")
    session = ChatSession.objects.create(owner=user, title=title)
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    send_message(page, "Hello")
    page.wait_for_selector("[data-role=assistant][data-status=complete] .msg-actions")
    if not page.phone:
        assert page.locator("#more-btn").is_hidden()
        assert page.locator("#toggle-turns").is_visible()
        return
    assert page.locator("#more-btn").is_visible()
    assert page.locator("#toggle-turns").is_hidden()
    # The title is readable: the whole of it, or most of a line.
    box = page.locator("#chat-title").bounding_box()
    assert box is not None and box["width"] >= 150
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate(SMALL_TARGETS) == []
    page.click("#more-btn")
    page.wait_for_selector("#head-tools.open #toggle-turns")
    assert page.get_attribute("#more-btn", "aria-expanded") == "true"
    assert page.evaluate(SMALL_TARGETS) == []
    screenshot(page, f"27-phone-menu-{page.variant}")
    page.click("#toggle-turns")
    page.wait_for_selector("#turns-panel:not([hidden])")
    assert page.get_attribute("#more-btn", "aria-expanded") == "false"
    page.keyboard.press("Escape")
    page.click("#open-sidebar")
    wait_js(page, "document.getElementById('sidebar').getBoundingClientRect().x >= 0")
    assert page.evaluate(SMALL_TARGETS) == []


def test_a_long_agent_name_stays_inside_the_sidebar(page: Any, app: LiveApp, user: Any) -> None:
    """A probe: a 100-character name (allowed) stretched the agent picker and the New chat
    button to 819 px in the 270 px sidebar, over the chat."""
    Agent.objects.create(owner=user, name="A" * 100, model="")
    login(page, app, user)
    page.wait_for_selector("#agent-picker:not([hidden]) select")
    sidebar = page.eval_on_selector(".sidebar", "n => n.getBoundingClientRect().right")
    for selector in ("#agent-picker select", "#new-chat"):
        right = page.eval_on_selector(selector, "n => n.getBoundingClientRect().right")
        assert right <= sidebar, (selector, right, sidebar)
