"""The page tells the truth about compaction: the ring moves when a compaction ends (its event
carries the budget), the notice says what happened (only a committed compaction "compacted
older turns"), the ring's colours follow the session's threshold after it, and a read-only
history panel shows the summary the model sees and the past snapshots. Plus Edit waits while
a reply streams (editing deletes the reply).

Compactions are started by another client over the token API, never by the page's own
"Compact now" (whose answer would update the ring by itself): what the page shows comes from
the `compaction` events on its socket."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from chat.context.heading import SUMMARY_PREFIX_EN
from chat.models import Agent, ChatMessage, ChatSession, MessageRole, SnapshotOutcome
from tests.browser.conftest import PASSWORD, LiveApp, login
from tests.factories import ContextSnapshotFactory
from tests.fixtures_llm import summary_of

BUDGET = 10_000


def _session(user: Any, *, turns: int = 4, runes: int = 750) -> ChatSession:
    """At 60% of a 10,000-rune budget with the threshold at 50: "danger" on the ring."""
    agent = Agent.objects.create(
        owner=user,
        name=f"a{ChatSession.objects.count()}",
        config_json={
            "context": {"input_budget_runes": BUDGET, "threshold_pct": 50, "target_pct": 30}
        },
    )
    session = ChatSession.objects.create(owner=user, agent=agent, title="Compaction")
    roles = [MessageRole.USER, MessageRole.ASSISTANT] * turns
    ChatMessage.objects.bulk_create(
        ChatMessage(session=session, role=role, content=f"{role} {i} " + "x" * runes)
        for i, role in enumerate(roles)
    )
    ChatSession.objects.filter(pk=session.pk).update(message_count=len(roles))
    return session


def _api(app: LiveApp, user: Any) -> httpx.Client:
    token = httpx.post(
        f"{app.url}/api/v1/auth/token", json={"username": user.username, "password": PASSWORD}
    ).json()["token"]
    return httpx.Client(base_url=app.url, timeout=30, headers={"Authorization": f"Token {token}"})


def _open(page: Any, app: LiveApp, user: Any, session: ChatSession) -> None:
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector("[data-message-id]")
    page.wait_for_function("() => document.documentElement.dataset.socket === 'open'")


def _ring(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """(() => {
          const u = document.getElementById('usage');
          return {pct: Number(u.dataset.usedPct), level: u.dataset.level,
                  threshold: Number(u.dataset.thresholdPct)};
        })()"""
    )


def _notice(page: Any) -> str:
    page.wait_for_selector("#notice:not([hidden])")
    return str(page.inner_text("#notice"))


def test_the_ring_and_notice_follow_a_compaction_made_elsewhere(
    page: Any, app: LiveApp, user: Any
) -> None:
    session = _session(user)
    _open(page, app, user, session)
    before = _ring(page)
    assert before["threshold"] == 50 and before["pct"] >= 50 and before["level"] == "danger"

    app.fake.script_summary(summary_of("A short digest of the early turns."))
    with _api(app, user) as http:
        answer = http.post(f"/api/v1/chat/sessions/{session.pk}/compact", json={})
    assert answer.status_code == 200 and answer.json()["outcome"] == "committed"
    expected = answer.json()["context_budget"]["used_pct"]
    # The page did not ask: the socket's `compaction` event carried the budget.
    page.wait_for_function(
        f"() => Number(document.getElementById('usage').dataset.usedPct) === {expected}"
    )
    after = _ring(page)
    assert after["pct"] < 50 <= before["pct"]
    # Coloured against this session's threshold (50), not a fixed 70/88.
    assert after["level"] == ("warn" if after["pct"] >= 50 * 70 / 88 else "ok")
    assert _notice(page) == "Older turns were compacted into the summary."


def test_a_compaction_that_compacted_nothing_says_so(page: Any, app: LiveApp, user: Any) -> None:
    session = _session(user, turns=1, runes=50)  # one turn: nothing may be cut
    _open(page, app, user, session)
    with _api(app, user) as http:
        answer = http.post(f"/api/v1/chat/sessions/{session.pk}/compact", json={})
        assert answer.json()["outcome"] == "skipped"
        page.wait_for_function(
            "() => document.getElementById('notice').textContent.startsWith('Nothing was')"
        )
        text = _notice(page)
        assert text == "Nothing was compacted: the recent turns must stay word for word."

        # Another compaction holds the session: "busy", said as such.
        ChatSession.objects.filter(pk=session.pk).update(
            compaction_lease_token="elsewhere",
            compaction_lease_until=timezone.now() + timedelta(minutes=5),
        )
        answer = http.post(f"/api/v1/chat/sessions/{session.pk}/compact", json={})
        assert answer.status_code == 409
    page.wait_for_function(
        "() => document.getElementById('notice').textContent.includes('another compaction')"
    )
    assert "compacted into the summary" not in _notice(page)
    assert app.fake.count("summary") == 0


def test_every_outcome_has_its_own_words(page: Any, app: LiveApp, user: Any) -> None:
    session = _session(user, turns=1, runes=50)
    _open(page, app, user, session)
    said = page.evaluate(
        """async () => {
          const { compactionNotice } = await import('/static/chat/compaction.js');
          const out = {};
          for (const o of ['committed', 'skipped', 'busy', 'conflict', 'failed', 'rejected']) {
            out[o] = compactionNotice(o, o === 'committed' ? 3 : 0);
          }
          return out;
        }"""
    )
    texts = {outcome: s["text"] for outcome, s in said.items()}
    assert texts["committed"] == "Older turns were compacted into the summary."
    for outcome in ("skipped", "busy", "conflict"):
        assert texts[outcome].startswith("Nothing was compacted"), texts
        assert said[outcome]["level"] == "info"
    assert len({texts["skipped"], texts["busy"], texts["conflict"]}) == 3
    assert said["failed"]["level"] == said["rejected"]["level"] == "error"


def test_outcomes_are_said_in_chinese_too(browser: Any, app: LiveApp, user: Any) -> None:
    session = _session(user, turns=1, runes=50)
    ctx = browser.new_context(locale="zh-CN", extra_http_headers={"Accept-Language": "zh-hans"})
    try:
        page = ctx.new_page()
        _open(page, app, user, session)
        text = page.evaluate(
            """async () => (await import('/static/chat/compaction.js'))
                 .compactionNotice('conflict', 0).text"""
        )
        assert text == "未压缩任何内容：对话在此期间已改变，稍后会重试。"
    finally:
        ctx.close()


def test_history_panel_shows_the_summary_in_force_and_pages_of_snapshots(
    page: Any, app: LiveApp, user: Any
) -> None:
    session = _session(user)
    ids = list(session.messages.order_by("id").values_list("id", flat=True))
    for i in range(23):
        ContextSnapshotFactory(
            session=session,
            summary=f"digest {i}",
            covers_from_message_id=ids[0],
            covers_to_message_id=ids[1],
            summary_through_message_id=ids[1],
            verbatim_since_message_id=ids[2],
        )
    ContextSnapshotFactory(
        session=session,
        outcome=SnapshotOutcome.REWOUND,
        trigger="truncate",
        summary="digest 22",
        summary_through_message_id=ids[1],
        verbatim_since_message_id=ids[2],
    )
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary="digest 22", verbatim_since_message_id=ids[2]
    )
    _open(page, app, user, session)
    page.click("#toggle-history")
    page.wait_for_selector("#history-list .history-entry")
    sent = page.inner_text("#summary-now .summary-sent")
    assert sent == f"{SUMMARY_PREFIX_EN}\ndigest 22"
    assert f"#{ids[2]}" in page.inner_text("#summary-now")
    entries = page.locator("#history-list .history-entry")
    assert entries.count() == 20
    newest = entries.nth(0)
    assert newest.get_attribute("data-outcome") == "rewound"
    assert "Rewound by an edit" in newest.inner_text()
    second = entries.nth(1).inner_text()
    assert "Compacted" in second and f"Messages #{ids[0]}–#{ids[1]}" in second
    assert entries.nth(1).locator("time").count() == 1
    # Read-only: no control in the panel changes anything.
    assert page.locator("#history-panel form, #history-panel textarea").count() == 0
    page.click("#history-older")
    page.wait_for_function("() => document.querySelectorAll('.history-entry').length === 24")
    assert page.locator("#history-older").is_hidden()


def test_an_open_history_panel_follows_a_compaction(page: Any, app: LiveApp, user: Any) -> None:
    session = _session(user)
    _open(page, app, user, session)
    page.click("#toggle-history")
    page.wait_for_selector("#history-status:has-text('No compactions yet.')")
    app.fake.script_summary(summary_of("The digest after compaction."))
    with _api(app, user) as http:
        http.post(f"/api/v1/chat/sessions/{session.pk}/compact", json={})
    page.wait_for_selector("#history-list .history-entry[data-outcome='committed']")
    assert "The digest after compaction." in page.inner_text("#summary-now")


@pytest.mark.parametrize("stop", [True, False])
def test_edit_waits_while_a_reply_streams(page: Any, app: LiveApp, user: Any, stop: bool) -> None:
    session = _session(user, turns=1, runes=50)
    _open(page, app, user, session)
    edit = page.locator('[data-role="user"] [data-action="edit"]').first
    assert edit.is_enabled()
    app.fake.script({"content": " ".join(f"w{i}" for i in range(60)), "token_ms": 40})
    page.fill("#composer-input", "talk slowly")
    page.press("#composer-input", "Enter")
    page.wait_for_selector('[data-status="streaming"] .msg-body:not(:empty)')
    buttons = page.locator('[data-action="edit"]')
    assert buttons.count() == 2
    assert all(buttons.nth(i).is_disabled() for i in range(2))
    if stop:
        page.click("#stop-btn")
    page.wait_for_selector('[data-role="assistant"]:last-child:not([data-status="streaming"])')
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-action=edit]')].every((b) => !b.disabled)"
    )
