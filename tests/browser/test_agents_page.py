"""The agents page in a browser: make an agent, edit it, chat with it so its daily note fills,
read the note by day, search, edit and delete its long-term memories, delete the agent; also
at phone width in Simplified Chinese."""

from __future__ import annotations

import re
from typing import Any

from chat.models import Agent
from tests.browser.conftest import LiveApp, login, screenshot
from tests.browser.test_chat_page import wait_js

REMEMBER = """async ([agentId, content]) => {
  const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
  const r = await fetch(`/api/v1/agents/${agentId}/memory/entries`, {
    method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', 'X-CSRFToken': token},
    body: JSON.stringify({content}),
  });
  return r.status;
}"""


def test_make_edit_use_and_delete_an_agent(page: Any, app: LiveApp, user: Any) -> None:
    page.on("dialog", lambda dialog: dialog.accept())
    agent = _agent_make(page, app, user)
    # Edit: a new name, extraction off; what the form does not show is kept.
    _agent_edit(page, agent)
    # A chat with the agent writes its daily note (auto-append), readable here by day.
    _daily_note_check(page, app, agent)
    # Long-term memory: search, edit, delete.
    _memory_search_edit_delete(page, agent)
    # Delete the agent: back to the list; its chat stays, without an agent.
    page.click("#agent-delete")
    page.wait_for_url(re.compile(r"/agents/$"))
    assert not Agent.objects.filter(pk=agent.pk).exists()
    assert page.evaluate("window.__xss") == 0


def _agent_make(page: Any, app: LiveApp, user: Any) -> Agent:
    """From an empty agents page, make one through the form and check what was stored."""
    login(page, app, user)
    page.click("#agents-link")
    page.wait_for_url(re.compile(r"/agents/$"))
    page.wait_for_selector("#agents-status:has-text('No agents yet.')")
    page.click("#new-agent")
    page.fill("#agent-name", "Tea <i>expert</i>")
    page.fill("#agent-prompt", "You know tea.")
    page.select_option("#agent-model", "fake-chat")
    page.check("#agent-auto-append")
    page.uncheck("#agent-tools input[value='current_time']")
    page.click("#agent-save")
    page.wait_for_url(re.compile(r"/agents/\d+/$"))
    agent = Agent.objects.get(owner=user)
    assert (agent.name, agent.system_prompt, agent.model) == (
        "Tea <i>expert</i>",
        "You know tea.",
        "fake-chat",
    )
    assert agent.config_json["memory_auto_append"] is True
    assert "current_time" not in agent.config_json["tools"]
    page.wait_for_selector(f'#agents-list li[data-agent-id="{agent.pk}"]')
    assert page.text_content("#agent-form-title") == "Tea <i>expert</i>"
    return agent


def _agent_edit(page: Any, agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(
        config_json={**agent.config_json, "time_zone": "Asia/Shanghai"}
    )
    page.reload()
    wait_js(page, "document.getElementById('agent-name').value === 'Tea <i>expert</i>'")
    page.fill("#agent-name", "Tea master")
    page.uncheck("#agent-auto-extract")
    page.click("#agent-save")
    page.wait_for_selector("#notice:has-text('Agent saved.')")
    agent.refresh_from_db()
    assert agent.name == "Tea master"
    assert agent.config_json["memory_auto_extract"] is False
    assert agent.config_json["time_zone"] == "Asia/Shanghai"


def _daily_note_check(page: Any, app: LiveApp, agent: Agent) -> None:
    page.goto(app.url + "/")
    page.wait_for_selector("#agent-picker:not([hidden])")
    page.select_option("#agent-select", str(agent.pk))
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
    app.fake.script("Oolong sits between green and black.")
    page.fill("#composer-input", "What is oolong?")
    page.press("#composer-input", "Enter")
    page.wait_for_selector('[data-role="assistant"][data-status="complete"]')
    page.goto(f"{app.url}/agents/{agent.pk}/")
    wait_js(page, "document.getElementById('daily-note').textContent.includes('What is oolong?')")
    assert "Oolong sits between green and black." in page.text_content("#daily-note")
    assert page.locator("#daily-days option").count() == 2  # the label and today


def _memory_search_edit_delete(page: Any, agent: Agent) -> None:
    assert page.evaluate(REMEMBER, [agent.pk, "The user likes jasmine tea."]) == 201
    assert page.evaluate(REMEMBER, [agent.pk, "Deploys happen on Fridays."]) == 201
    page.reload()
    page.wait_for_selector("#entries-list li >> nth=1")
    page.fill("#entries-q", "jasmine")
    page.click("#entries-search button")
    wait_js(page, "document.querySelectorAll('#entries-list li').length === 1")
    item = page.locator("#entries-list li")
    item.locator("[data-action=edit]").click()
    item.locator(".entry-text").fill("The user likes jasmine tea, no sugar.")
    item.locator("[data-action=save]").click()
    page.wait_for_selector("#notice:has-text('Memory saved.')")
    screenshot(page, "agents-page")
    entries = page.evaluate(
        f"fetch('/api/v1/agents/{agent.pk}/memory/entries').then((r) => r.json())"
    )["results"]
    assert sorted(e["content"] for e in entries) == [
        "Deploys happen on Fridays.",
        "The user likes jasmine tea, no sugar.",
    ]
    page.locator("#entries-list li [data-action=delete]").click()
    page.wait_for_selector(
        "#entries-status:has-text('Nothing in memory matches.')", state="attached"
    )
    entries = page.evaluate(
        f"fetch('/api/v1/agents/{agent.pk}/memory/entries').then((r) => r.json())"
    )["results"]
    assert [e["content"] for e in entries] == ["Deploys happen on Fridays."]


def test_the_agents_page_at_phone_width_in_chinese(browser: Any, app: LiveApp, user: Any) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="zh-CN")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        agent = Agent.objects.create(owner=user, name="研究助手", system_prompt="简洁回答。")
        login(page, app, user, next_path=f"/agents/{agent.pk}/")
        wait_js(page, "document.getElementById('agent-name').value === '研究助手'")
        assert page.text_content(".agents-head h1") == "我的智能体"
        page.wait_for_selector("#entries-status:has-text('还没有长期记忆')")
        # Nothing wider than the screen.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        screenshot(page, "agents-page-phone-zh")
    finally:
        context.close()
    assert not errors, errors


def test_renaming_keeps_what_an_admin_set(page: Any, app: LiveApp, user: Any) -> None:
    """A model outside LLM_ALLOWED_MODELS and a limit over the user's cap, set by an admin, are
    not sent back by a rename (the API would refuse them from this user); an agent without a
    tool list keeps having none."""
    agent = Agent.objects.create(
        owner=user,
        name="Set by admin",
        model="admin-only-model",
        config_json={"max_tool_rounds": 40},
    )
    login(page, app, user, next_path=f"/agents/{agent.pk}/")
    wait_js(page, "document.getElementById('agent-name').value === 'Set by admin'")
    assert page.input_value("#agent-model") == "admin-only-model"
    # The boxes show what the agent gets: the built-in tools.
    assert page.is_checked("#agent-tools input[value='current_time']")
    page.fill("#agent-name", "Renamed by me")
    page.click("#agent-save")
    page.wait_for_selector("#notice:has-text('Agent saved.')")
    agent.refresh_from_db()
    assert agent.name == "Renamed by me"
    assert agent.model == "admin-only-model"
    assert agent.config_json == {"max_tool_rounds": 40}
