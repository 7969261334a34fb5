"""The page follows a reply's real state (static/chat/stream.js): through an agent's tool
rounds to the answer, and from the moment Send is pressed to the first token of a slow model,
which Stop can cancel. English on a desktop and Chinese on a 390 px phone (`variant_page`)."""

from __future__ import annotations

import json
import re
from typing import Any

from chat.models import Agent, ChatMessage, ChatSession, MessageRole, MessageStatus
from tests.browser.conftest import (
    LiveApp,
    login,
    say,
    screenshot,
    send_message,
    wait_js,
    wait_socket,
)

STREAMING_REPLIES = "document.querySelectorAll('[data-role=assistant][data-status=streaming]')"


def _idle(page: Any) -> bool:
    """Send works, Stop is gone, no bubble says it is still being generated."""
    return bool(
        page.evaluate(
            "!document.getElementById('send-btn').disabled"
            " && document.getElementById('stop-btn').hidden"
            f" && {STREAMING_REPLIES}.length === 0"
            " && !document.getElementById('pending-reply')"
            " && !document.querySelector('.msg-state.streaming')"
        )
    )


def test_a_tool_round_ends_when_its_answer_comes(
    variant_page: Any, app: LiveApp, user: Any
) -> None:
    page = variant_page
    agent = Agent.objects.create(
        owner=user, name="Timekeeper", model="", config_json={"tools": ["current_time"]}
    )
    session = ChatSession.objects.create(owner=user, agent=agent, title="Tools")
    answer = " ".join(f"w{i}" for i in range(30))
    app.fake.script(
        {"content": "Let me check.", "tool_calls": [{"name": "current_time", "arguments": {}}]},
        {"content": answer, "token_ms": 60},
    )
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    send_message(page, "What time is it?")
    # While the answer streams, the round that asked for the tool is over: one bubble streams.
    page.wait_for_selector("[data-role=tool]")
    wait_js(
        page,
        f"[...{STREAMING_REPLIES}].some(n => n.textContent.includes('w3'))",
    )
    assert page.evaluate(f"{STREAMING_REPLIES}.length") == 1
    tool_call_row = page.locator("[data-role=assistant]").first
    assert tool_call_row.get_attribute("data-status") == "complete"
    assert "current_time" in tool_call_row.inner_text()
    # The answer: every bubble final, Send back, Stop gone (the bug: the tool-calling bubble
    # kept saying "Generating…" and Send stayed disabled until a reload).
    wait_js(page, "document.querySelector('[data-role=assistant]:last-of-type') !== null")
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('w29'))",
    )
    wait_js(page, "!document.getElementById('send-btn').disabled")
    assert _idle(page)
    tool = page.locator("[data-role=tool] summary").inner_text()
    assert tool == say(page, "Tool · current_time", "工具 · current_time")
    assert "call_" not in page.locator("[data-role=tool]").inner_text()
    screenshot(page, f"27-tool-round-{page.variant}")
    # The stored rows agree, and the next turn goes through as usual.
    rows = list(session.messages.order_by("id").values_list("role", "status"))
    assert rows == [
        (MessageRole.USER, MessageStatus.COMPLETE),
        (MessageRole.ASSISTANT, MessageStatus.COMPLETE),
        (MessageRole.TOOL, MessageStatus.COMPLETE),
        (MessageRole.ASSISTANT, MessageStatus.COMPLETE),
    ]
    app.fake.script("Second answer.")
    send_message(page, "Thanks")
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('Second answer.'))",
    )
    wait_js(page, "!document.getElementById('send-btn').disabled")
    assert _idle(page)
    # After a reload the same, from the stored rows.
    page.reload()
    page.wait_for_selector("[data-role=tool] summary")
    assert page.locator("[data-role=tool] summary").inner_text() == tool
    assert _idle(page)


def test_a_slow_start_shows_a_pending_reply_that_stop_cancels(
    variant_page: Any, app: LiveApp, user: Any
) -> None:
    page = variant_page
    session = ChatSession.objects.create(owner=user, title="Slow start")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    # The model answers nothing for 20 s.
    app.fake.fail_next("hang", target="chat", seconds=20)
    send_message(page, "Are you there?")
    pending = page.wait_for_selector("#pending-reply[aria-busy=true]", timeout=2_000)
    assert pending.query_selector(".typing") is not None
    assert say(page, "preparing a reply", "正在准备回复") in (pending.text_content() or "")
    assert page.locator("#stop-btn").is_visible() and page.locator("#stop-btn").is_enabled()
    assert page.locator("#send-btn").is_disabled()
    assert page.get_attribute("#composer", "aria-busy") == "true"
    screenshot(page, f"27-pending-{page.variant}")
    # Stop before the first token cancels the reply on the server.
    page.click("#stop-btn")
    page.wait_for_selector("[data-role=assistant][data-status=cancelled]", timeout=10_000)
    assert page.locator("#pending-reply").count() == 0
    wait_js(page, "!document.getElementById('send-btn').disabled")
    assert _idle(page)
    assert page.locator("#notice").is_hidden() or "No reply" not in page.inner_text("#notice")
    reply = ChatMessage.objects.get(session=session, role=MessageRole.ASSISTANT)
    assert reply.status == MessageStatus.CANCELLED and reply.content == ""
    app.fake.release()

    # A slow start that ends: the pending bubble gives way to the reply (the fake's echo: a
    # scripted reply could go to the released call above).
    app.fake.fail_next("hang", target="chat", seconds=1.5)
    send_message(page, "And now?")
    page.wait_for_selector("#pending-reply", timeout=2_000)
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('Echo: And now?'))",
    )
    wait_js(page, "!document.getElementById('send-btn').disabled")
    assert _idle(page)


class HoldAfterToolCall:
    """The page's WebSocket through Playwright: frames pass until the first `tool_call`, which
    is delivered; the ones after it wait until `release()` (the tools running, as the page sees
    it, for as long as the test looks)."""

    def __init__(self, page: Any) -> None:
        self.held = False
        self.waiting: list[str | bytes] = []
        self.route: Any = None
        page.route_web_socket(re.compile(r"/ws/chat/\d+/$"), self._connect)

    def _connect(self, route: Any) -> None:
        self.route = route
        route.connect_to_server().on_message(self._from_server)

    def _from_server(self, message: str | bytes) -> None:
        if self.held:
            self.waiting.append(message)
            return
        self.route.send(message)
        if isinstance(message, str) and json.loads(message).get("type") == "tool_call":
            self.held = True

    def release(self) -> None:
        self.held = False
        for message in self.waiting:
            self.route.send(message)
        self.waiting.clear()


def test_a_round_waiting_for_its_tools_says_so(variant_page: Any, app: LiveApp, user: Any) -> None:
    page = variant_page
    agent = Agent.objects.create(owner=user, name="Clock", config_json={"tools": ["current_time"]})
    session = ChatSession.objects.create(owner=user, agent=agent, title="Held")
    app.fake.script(
        {"content": "", "tool_calls": [{"name": "current_time", "arguments": {}}]},
        "The time is known.",
    )
    socket = HoldAfterToolCall(page)
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    wait_socket(page)
    send_message(page, "Time?")
    state = page.wait_for_selector("[data-role=assistant] .msg-state.tools")
    assert state.inner_text() == say(page, "Running current_time…", "正在运行 current_time…")
    assert page.locator("#send-btn").is_disabled() and page.locator("#stop-btn").is_visible()
    assert page.locator("#pending-reply").count() == 0
    screenshot(page, f"27-tools-running-{page.variant}")
    socket.release()
    wait_js(
        page,
        "[...document.querySelectorAll('[data-role=assistant][data-status=complete]')]"
        ".some(n => n.textContent.includes('The time is known.'))",
    )
    wait_js(page, "!document.getElementById('send-btn').disabled")
    assert _idle(page)
