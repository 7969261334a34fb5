"""axe-core (npm, node_modules/axe-core) run inside Chromium: no serious or critical
violation on the login, chat (a reply with code, math, a table and a task list), search and
agents pages, in English and Chinese, desktop and 390 px."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chat.models import Agent, ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import PASSWORD, LiveApp
from tests.browser.test_formatted_replies import REPLY
from tests.browser.variants import VARIANT_IDS, VARIANTS, Variant, doc_screenshot, variant_page

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
RUN_AXE = """async () => {
  const result = await axe.run(document, {
    runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]},
  });
  return result.violations
    .filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(n => [n.target.join(" "), n.failureSummary])}));
}"""


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """The page's serious and critical violations (the page's context bypasses the CSP only
    so this script can be added)."""
    if not AXE.exists():
        pytest.fail(f"{AXE} missing: `npm ci` installs axe-core from package-lock.json")
    page.evaluate(AXE.read_text())
    result: list[dict[str, Any]] = page.evaluate(RUN_AXE)
    return result


def _assert_clean(page: Any, where: str) -> None:
    violations = axe_violations(page)
    assert not violations, f"{where}: " + json.dumps(violations, ensure_ascii=False, indent=1)


def _login(page: Any, app: LiveApp, user: Any, next_path: str) -> None:
    page.goto(app.url + "/accounts/login/?next=" + next_path)
    _assert_clean(page, "login")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state("domcontentloaded")


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_no_serious_violations(browser: Any, app: LiveApp, user: Any, variant: Variant) -> None:
    agent = Agent.objects.create(owner=user, name="Helper", model="")
    session = ChatSession.objects.create(owner=user, title="Formatting", agent=agent)
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="Show me a demo")
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content=REPLY)
    ChatSession.objects.filter(pk=session.pk).update(message_count=2)
    with variant_page(browser, variant, bypass_csp=True) as page:
        _login(page, app, user, f"/chat/{session.pk}/")
        page.wait_for_selector("[data-role=assistant] .code-block")
        page.wait_for_selector("#ring-pct")
        _assert_clean(page, "chat")
        # Search: the results list open with a hit.
        if variant.phone:
            page.click("#open-sidebar")
        page.fill("#search-input", "demo")
        page.wait_for_selector("#search-list [role=option]")
        _assert_clean(page, "search")
        if variant == VARIANTS[0]:
            doc_screenshot(page, "search")
        # The agents page with an agent open: its list, form, memory and daily notes.
        page.goto(f"{app.url}/agents/{agent.pk}/")
        page.wait_for_selector("#agent-form:not([hidden])")
        page.wait_for_load_state("networkidle")
        _assert_clean(page, "agents")
