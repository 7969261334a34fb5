"""The usage ring colours against the session's own compaction threshold (an agent's
`config_json["context"]["threshold_pct"]`), not a fixed 88."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chat.models import Agent, ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login

BUDGET = 10_000


def _session_at_sixty_pct(user: Any, context: dict[str, int]) -> ChatSession:
    """Same budget, same messages (~6,000 of 10,000 runes): only the threshold differs."""
    agent = Agent.objects.create(
        owner=user,
        name=f"t{context.get('threshold_pct', 'default')}",
        config_json={"context": context},
    )
    session = ChatSession.objects.create(owner=user, agent=agent, title="Ring")
    roles = [MessageRole.USER, MessageRole.ASSISTANT] * 2
    ChatMessage.objects.bulk_create(
        ChatMessage(session=session, role=role, content="x" * 1500) for role in roles
    )
    ChatSession.objects.filter(pk=session.pk).update(message_count=len(roles))
    return session


def _ring(page: Any, app: LiveApp, session: ChatSession) -> dict[str, Any]:
    page.goto(f"{app.url}/chat/{session.pk}/")
    page.wait_for_selector("[data-message-id]")
    return page.evaluate(
        """(() => {
          // The colour eases in (a CSS transition): read where it ends.
          for (const a of document.getAnimations()) a.finish();
          const usage = document.getElementById('usage');
          const stroke = (level) => {
            // The colour the stylesheet gives `level` (a probe, not the ring under test).
            const probe = usage.cloneNode(true);
            probe.dataset.level = level;
            probe.hidden = true;
            document.body.append(probe);
            const colour = getComputedStyle(probe.querySelector('.ring-value')).stroke;
            probe.remove();
            return colour;
          };
          return {
            pct: Number(usage.dataset.usedPct),
            level: usage.dataset.level,
            threshold: Number(usage.dataset.thresholdPct),
            stroke: getComputedStyle(document.getElementById('ring-value')).stroke,
            danger: stroke('danger'),
            ok: stroke('ok'),
          };
        })()"""
    )


def test_ring_uses_the_agents_threshold(page: Any, app: LiveApp, user: Any) -> None:
    low = _session_at_sixty_pct(
        user, {"input_budget_runes": BUDGET, "threshold_pct": 50, "target_pct": 30}
    )
    default = _session_at_sixty_pct(user, {"input_budget_runes": BUDGET})
    login(page, app, user, next_path=f"/chat/{low.pk}/")

    ring = _ring(page, app, low)
    # Green under the fixed 70/88 levels the ring had before ...
    assert 50 <= ring["pct"] < 70, ring
    # ... past this agent's threshold of 50: the "over threshold" colour.
    assert ring["threshold"] == 50
    assert ring["level"] == "danger"
    assert ring["stroke"] == ring["danger"] != ring["ok"]

    # The same usage under the default threshold (88) stays green.
    ring = _ring(page, app, default)
    assert 50 <= ring["pct"] < 70, ring
    assert (ring["threshold"], ring["level"]) == (settings.CHAT_CONTEXT.threshold_pct, "ok")
    assert ring["stroke"] == ring["ok"]


RING_LOGIC = """async () => {
  const { ringLevel, updateRing } = await import('/static/chat/ring.js');
  const root = document.createElement('div');
  root.innerHTML = '<svg><circle id="ring-value"></circle></svg><span id="ring-pct"></span>'
    + '<span id="ring-tip"></span><button id="ring-btn"></button>';
  const levels = (at) => [0, 39, 40, 69, 70, 87, 88, 100].map((p) => ringLevel(p, at));
  // A budget that names its threshold overrides the page's.
  updateRing(root, {used_pct: 45, threshold_pct: 40}, {thresholdPct: 88, format: () => ''});
  const fromBudget = [root.dataset.level, root.dataset.thresholdPct];
  updateRing(root, {used_pct: 45}, {thresholdPct: 88, format: () => ''});
  return {at88: levels(88), at50: levels(50), fromBudget,
          fromPage: [root.dataset.level, root.dataset.thresholdPct]};
}"""


def test_ring_levels_scale_with_the_threshold(page: Any, app: LiveApp) -> None:
    page.goto(app.url + "/accounts/login/")
    out = page.evaluate(RING_LOGIC)
    # The default threshold keeps the levels the ring always had: warn from 70, danger from 88.
    assert out["at88"] == ["ok", "ok", "ok", "ok", "warn", "warn", "danger", "danger"]
    # At 50, warn starts at the same share of it (~40).
    assert out["at50"] == ["ok", "ok", "warn", "danger", "danger", "danger", "danger", "danger"]
    assert out["fromBudget"] == ["danger", "40"]
    assert out["fromPage"] == ["ok", "88"]
