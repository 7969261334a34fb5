"""Agent sessions in the page: the agent picker on "New chat", the memory panel and the
"Remember" action (shown only when the session has an agent and the agents API exists)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import Resolver404, resolve

from chat.models import Agent, ChatSession
from tests.browser.conftest import LiveApp, login, screenshot


def _agents_api() -> bool:
    try:
        resolve("/api/v1/agents")
    except Resolver404:
        return False
    return True


def test_agent_picker_remember_and_memory_panel(page: Any, app: LiveApp, user: Any) -> None:
    if not _agents_api():
        pytest.skip("the agents API is not routed in this build")
    agent = Agent.objects.create(owner=user, name="Researcher", system_prompt="Be brief.")
    plain = ChatSession.objects.create(owner=user, title="No agent here")
    login(page, app, user, next_path=f"/chat/{plain.pk}/")
    page.wait_for_selector("#agent-picker:not([hidden])")
    # A session without an agent has no memory controls.
    assert page.locator("#toggle-memory").is_hidden()

    page.select_option("#agent-select", str(agent.pk))
    page.click("#new-chat")
    page.wait_for_url(
        lambda url: bool(re.search(r"/chat/\d+/$", url)) and not url.endswith(f"/{plain.pk}/")
    )
    session = ChatSession.objects.exclude(pk=plain.pk).get(owner=user)
    assert session.agent_id == agent.pk
    page.wait_for_function("() => document.documentElement.dataset.socket === 'open'")
    page.fill("#composer-input", "The deploy window is Tuesday 14:00 UTC")
    page.press("#composer-input", "Enter")
    page.wait_for_selector('[data-role="assistant"][data-status="complete"]')
    user_message = page.locator('[data-role="user"]').first
    user_message.hover()
    user_message.locator("[data-action=remember]").click()
    page.wait_for_selector('[data-role="user"] [data-action=remember][disabled]')
    page.click("#toggle-memory")
    page.wait_for_selector(".memory-entry")
    assert "Tuesday 14:00 UTC" in page.locator("#memory-list").inner_text()
    screenshot(page, "11-agent-memory")
