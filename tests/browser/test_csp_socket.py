"""The CSP's `connect-src 'self'` in Chromium: the page's own WebSocket (ws:// on the page's host
and port) opens, a socket to any other host or port is blocked by the policy, and the server
refuses a handshake whose Origin is another port of the same host."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from chat.models import ChatSession
from tests.browser.conftest import LiveApp, login
from tests.browser.test_chat_page import wait_js

# Opens a socket from the page and reports how it ended ("open" or "error"), or the exception
# the WebSocket constructor raised.
PROBE = """(url) => new Promise((resolve) => {
  let ws;
  try { ws = new WebSocket(url); } catch (e) { resolve('throw:' + e.name); return; }
  ws.onopen = () => { ws.close(); resolve('open'); };
  ws.onerror = () => resolve('error');
  setTimeout(() => resolve('timeout'), 5000);
})"""


def test_own_socket_opens_and_foreign_sockets_are_blocked(
    page: Any, app: LiveApp, user: Any
) -> None:
    session = ChatSession.objects.create(owner=user, title="CSP socket")
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    response = page.request.get(f"{app.url}/chat/{session.pk}/")
    csp = response.headers["content-security-policy"]
    assert "connect-src 'self';" in csp and "ws:" not in csp
    # The page's own socket, opened by the page's script, under the policy.
    wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
    port = urlsplit(app.url).port or 80
    own = f"ws://127.0.0.1:{port}/ws/chat/{session.pk}/"
    assert page.evaluate(PROBE, own) == "open"
    assert page.evaluate("window.__cspViolations") == []
    # Another port of the same host: the policy blocks it before any connection is made.
    assert page.evaluate(PROBE, f"ws://127.0.0.1:{port + 1}/ws/chat/{session.pk}/") != "open"
    assert page.evaluate(PROBE, "wss://example.invalid/socket") != "open"
    violations = page.evaluate("window.__cspViolations")
    assert any(v.startswith("connect-src") for v in violations), violations
