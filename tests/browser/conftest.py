"""Browser tests: the real app under Daphne (HTTP + WebSockets) on a loopback port, the fake
LLM server, and Debian's Chromium driven by Playwright.

Why not pytest-django's `live_server`: it is WSGI-only, and the page streams over a WebSocket.
So Daphne runs as a subprocess against the *test* database (the file/database pytest-django
created for this process), and tests write through `transactional_db` so the server sees
committed rows. The fake LLM server runs in this process; tests script it directly.

Chromium is the system one (`/usr/bin/chromium`, installed by `.ci/run` when missing); without
it the whole module is skipped with that reason. `playwright install` is never needed.

Tests drive the page as a person would and read the DOM. The one way into the app's state is
the frozen hook `window.cadau` (static/chat/app.js, `exposeTestHook`): `cadau.win` answers where
the message window stands (`cap`, `count`, `messages` as copies, `olderCursor`, `atLiveEdge`)
and `cadau.socket.drop()` drops the WebSocket, which reconnects by itself."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.procs import CHROMIUM, CHROMIUM_ARGS, NO_LIMITS, ServerProcess, database_url
from devtools.fakellm import FakeLLMServer
from tests.factories import UserFactory

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
PASSWORD = "pw-for-tests-1"  # UserFactory's

# Playwright's sync API keeps an event loop running in this thread, which trips Django's
# "async-unsafe" guard on every ORM call a test makes to set up data. The calls really are
# synchronous (this thread, between browser steps), so the guard is a false alarm here; it is
# lifted for this package's tests only (the `browser` fixture below), never for the suite.


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            if not Path(CHROMIUM).exists():
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"Chromium not found at {CHROMIUM} (apt-get install chromium; "
                        ".ci/run installs it)"
                    )
                )


def _database_url() -> str:
    from django.db import connection

    return database_url(connection.settings_dict)


@dataclass
class LiveApp:
    url: str
    fake: FakeLLMServer
    log: Path


@pytest.fixture(scope="package")
def live_app(
    django_db_setup: Any,
    django_db_blocker: Any,
    fake_llm_server: FakeLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveApp]:
    tmp_runtime = tmp_path_factory.mktemp("runtime")
    log = ROOT / "artifacts" / "browser-daphne.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Every test logs in through the form from 127.0.0.1 as one user, and the server's counters
    # (its own memory on SQLite) are not reset between tests; tests/test_limits.py and
    # tests/chat/test_send_limits.py cover the limits.
    env.update(NO_LIMITS)
    env.update(
        DATABASE_URL=_database_url(),
        DEBUG="false",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        LLM_BASE_URL=fake_llm_server.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="fake-chat",
        LLM_SUMMARY_MODEL="fake-summary",
        LLM_MAX_RETRIES="0",
        LLM_TIMEOUT_SECONDS="20",
        # Background compaction threads would outlive a test's data (flushed after each test).
        CHAT_BACKGROUND_COMPACTION="false",
        # Likewise a title call; and it would take the summaries the tests script.
        CHAT_AUTO_TITLE="words",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    # Agent memory files of these tests go to a scratch folder, never the checkout's runtime/.
    env["RUNTIME_DIR"] = str(tmp_runtime)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    server = ServerProcess.app(env=env, log_path=log)
    try:
        server.wait_ready(path="/accounts/login/")
        yield LiveApp(url=server.url, fake=fake_llm_server, log=log)
    finally:
        server.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Package-scoped: Playwright's sync API runs an event loop in this thread while it is
    open, which would break every later test that calls async code from sync code."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def app(live_app: LiveApp, transactional_db: Any) -> Iterator[LiveApp]:
    live_app.fake.reset()
    yield live_app
    live_app.fake.reset()


@pytest.fixture
def user(app: LiveApp) -> Any:
    return UserFactory(username=f"browser-{secrets.token_hex(3)}")


# A trap every test page carries: any payload that manages to run bumps window.__xss, and any
# inline script/handler/style the CSP blocks is counted too (it means markup got injected).
XSS_TRAP = """
window.__xss = 0;
window.__cspViolations = [];
window.alert = window.confirm_xss = function () { window.__xss += 1; };
document.addEventListener('securitypolicyviolation', function (e) {
  window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
    ctx.add_init_script(XSS_TRAP)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    yield page
    assert not errors, f"JavaScript errors on the page: {errors}"


def login(page: Any, app: LiveApp, user: Any, *, next_path: str = "/") -> None:
    """Through the real login form, as a person would."""
    page.goto(app.url + next_path)
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state("domcontentloaded")


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


# The chat page as its two kinds of reader see it: English on a desktop, Chinese on a 390 px
# phone. Tests that take `variant_page` run once for each.
VARIANTS: dict[str, dict[str, Any]] = {
    "en-desktop": {
        "lang": "en",
        "context": {"viewport": {"width": 1280, "height": 800}, "locale": "en-US"},
    },
    "zh-phone": {
        "lang": "zh",
        "context": {
            "viewport": {"width": 390, "height": 844},
            "locale": "zh-CN",
            "has_touch": True,
            "is_mobile": True,
        },
    },
}


@pytest.fixture(params=list(VARIANTS))
def variant_page(request: Any, browser: Any) -> Iterator[Any]:
    """A page in one of VARIANTS; `page.lang` is "en" or "zh", `page.phone` says 390 px."""
    variant = VARIANTS[request.param]
    ctx = browser.new_context(**variant["context"])
    ctx.add_init_script(XSS_TRAP)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.lang = variant["lang"]
        page.phone = variant["context"]["viewport"]["width"] <= 390
        page.variant = request.param
        yield page
        assert not errors, f"JavaScript errors on the page: {errors}"
    finally:
        ctx.close()


def say(page: Any, en: str, zh: str) -> str:
    """The text the page shows in its language."""
    return zh if page.lang == "zh" else en


def wait_js(page: Any, expression: str, timeout: float = 15_000) -> None:
    """wait_for_function with an expression is eval'd inside the page, which the CSP (no
    'unsafe-eval') refuses; a function is injected through the devtools protocol."""
    page.wait_for_function(f"() => ({expression})", timeout=timeout)


def send_message(page: Any, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


def wait_socket(page: Any) -> None:
    wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
