"""`python -m bench ui`: the chat page in a real browser on a seeded 10,000-message session.

Debian's Chromium (headless, Playwright) opens the session at its newest page, scrolls to the
oldest message and back to the newest, and reports: the largest number of message elements the
DOM ever held (a MutationObserver counts after every change; must stay <= the window cap), the
JS heap and DOM node count before and after the round trip (after a forced GC, via the devtools
protocol), the time to first contentful paint and to the newest page rendered, and the scroll
round trip's duration and page loads.

The app runs for real: Daphne in a subprocess on a loopback port against a SQLite file in
.bench/ (rebuilt each run: seeding 10k messages with seed_demo's code path takes a second)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import CHROMIUM, CHROMIUM_ARGS, ServerProcess, app_env

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
USER = "bench-ui"
PASSWORD = "bench-ui-" + "pw-1234"

# Counts message elements after every DOM change (installed before the app's script runs).
MAX_COUNTER = """
document.addEventListener('DOMContentLoaded', () => {
  window.__maxMessages = 0;
  const list = document.getElementById('message-list');
  if (list) new MutationObserver(() => {
    const n = list.querySelectorAll('[data-message-id]').length;
    if (n > window.__maxMessages) window.__maxMessages = n;
  }).observe(list, {childList: true});
});
"""

SEED = """
import django, json, sys
django.setup()
from django.contrib.auth import get_user_model
from chat.management.commands.seed_demo import seed_session
user = get_user_model().objects.create_user(username=sys.argv[1], password=sys.argv[2])
result = seed_session(user=user, messages=int(sys.argv[3]), title="UI bench")
print(json.dumps({"session_id": result.session_id, "seconds": result.seconds}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ui")
    group.add_argument("--ui-messages", type=int, default=10_000, help="messages in the session")
    group.add_argument("--ui-loads", type=int, default=5, help="timed page loads (first paint)")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _env(db: Path) -> dict[str, str]:
    return app_env(
        f"sqlite:///{db}",
        keep_redis=True,
        DJANGO_SETTINGS_MODULE="cadau.settings",
        LLM_BASE_URL="",  # the offline provider: nothing here talks to a model
    )


def _prepare(*, messages: int) -> tuple[dict[str, str], int]:
    CACHE.mkdir(exist_ok=True)
    db = CACHE / "ui.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    env = _env(db)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0", "--noinput"], cwd=ROOT, env=env, check=True
    )
    out = subprocess.run(
        [sys.executable, "-c", SEED, USER, PASSWORD, str(messages)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return env, int(json.loads(out.strip().splitlines()[-1])["session_id"])


def _metrics(cdp: Any) -> dict[str, float]:
    cdp.send("HeapProfiler.collectGarbage")
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def _page_weight(browser: Any, *, url: str, chat_url: str) -> dict[str, int]:
    """Bytes one cold load of the chat page costs (empty cache, fresh context): on the wire
    (bodies as sent, compressed or not) and decoded, summed over every response until the
    newest page is rendered."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(url + "/accounts/login/")
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state("load")
    # The devtools protocol's own counts: bytes received per request as sent (headers and
    # body, compressed or not) and the body's bytes after decoding.
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    # Cold: the login page already fetched the stylesheets and scripts.
    cdp.send("Network.clearBrowserCache")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    wire: dict[str, int] = {}
    decoded: dict[str, int] = {}
    cdp.on(
        "Network.loadingFinished",
        lambda e: wire.__setitem__(e["requestId"], e["encodedDataLength"]),
    )
    cdp.on(
        "Network.dataReceived",
        lambda e: decoded.__setitem__(
            e["requestId"], decoded.get(e["requestId"], 0) + e["dataLength"]
        ),
    )
    page.goto(chat_url)
    page.wait_for_function("() => document.documentElement.dataset.firstRender")
    page.wait_for_load_state("networkidle")
    context.close()
    return {
        "requests": len(wire),
        "wire": int(sum(wire.values())),
        "decoded": sum(decoded.values()),
    }


def _measure(*, url: str, session_id: int, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    result: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        result["browser"] = browser.version
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.add_init_script(MAX_COUNTER)
        page = context.new_page()
        page.goto(url + "/accounts/login/")
        page.fill("#id_username", USER)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-message-id]")

        chat_url = f"{url}/chat/{session_id}/"
        result["weight"] = _page_weight(browser, url=url, chat_url=chat_url)
        fcp, rendered = [], []
        for _ in range(loads):
            page.goto(chat_url)
            page.wait_for_function("() => document.documentElement.dataset.firstRender")
            rendered.append(float(page.evaluate("document.documentElement.dataset.firstRender")))
            # The page can mark its first render before the browser has painted it: wait for
            # the paint entry rather than read a missing one as NaN (which spoils the median).
            page.wait_for_function(
                "() => performance.getEntriesByName('first-contentful-paint').length > 0",
                timeout=5000,
            )
            fcp.append(
                float(
                    page.evaluate(
                        "(performance.getEntriesByName('first-contentful-paint')[0] || "
                        "{startTime: NaN}).startTime"
                    )
                )
            )
        result["fcp_ms"], result["rendered_ms"] = fcp, rendered

        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.wait_for_timeout(500)
        before = _metrics(cdp)
        started = time.perf_counter()
        up_steps = 0
        while not page.evaluate("cadau.win.olderCursor === null"):
            page.evaluate("document.getElementById('messages').scrollTop = 0")
            page.wait_for_timeout(30)
            up_steps += 1
        oldest = page.evaluate("cadau.win.messages[0].id")
        up_seconds = time.perf_counter() - started
        middle = _metrics(cdp)
        started = time.perf_counter()
        while not page.evaluate("cadau.win.atLiveEdge"):
            page.evaluate(
                "(b => b.scrollTop = b.scrollHeight)(document.getElementById('messages'))"
            )
            page.wait_for_timeout(30)
        page.wait_for_timeout(300)
        down_seconds = time.perf_counter() - started
        after = _metrics(cdp)
        result.update(
            oldest_id=oldest,
            max_dom=page.evaluate("window.__maxMessages"),
            dom_now=page.evaluate("document.querySelectorAll('[data-message-id]').length"),
            cap=page.evaluate("cadau.win.cap"),
            up_seconds=up_seconds,
            down_seconds=down_seconds,
            up_steps=up_steps,
            heap=(before["JSHeapUsedSize"], middle["JSHeapUsedSize"], after["JSHeapUsedSize"]),
            nodes=(before["Nodes"], middle["Nodes"], after["Nodes"]),
        )
        browser.close()
    return result


def run(*, args: Any, command: str) -> str:
    if not Path(CHROMIUM).exists():
        return f"## Chat page in a browser\n\nskipped: Chromium not found at {CHROMIUM}."
    _log(f"[ui] seeding {args.ui_messages:,} messages ...")
    env, session_id = _prepare(messages=args.ui_messages)
    with ServerProcess.app(env=env, log_path=CACHE / "daphne-ui.log") as server:
        server.wait_ready(path="/accounts/login/")
        _log("[ui] measuring in Chromium ...")
        r = _measure(url=server.url, session_id=session_id, loads=args.ui_loads)
    mib = 1024 * 1024
    heap_b, heap_m, heap_a = (h / mib for h in r["heap"])
    pages = args.ui_messages // 50
    lines = [
        "## Chat page in a browser: bounded window on a long session",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} "
        f"CPU(s), Python {platform.python_version()}, Chromium {r['browser']} (headless), "
        "Daphne on loopback, SQLite.",
        "",
        "```sh",
        f"{command}        # this section",
        "python -m bench ui --ui-messages 100000   # a longer session",
        "```",
        "",
        f"How: one session of {args.ui_messages:,} messages (seed_demo's generator), opened at "
        "`/chat/<id>/` after a login through the form. The page loads 50-message pages on "
        "scroll and drops whole pages from the far side. A MutationObserver records the "
        "largest number of `[data-message-id]` elements after every DOM change. Heap and DOM "
        "nodes come from the devtools protocol (`Performance.getMetrics`) after a forced GC.",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| messages in the session | {args.ui_messages:,} |",
        f"| window cap | {r['cap']} |",
        f"| max message elements in the DOM (newest → oldest → newest) | **{r['max_dom']}** |",
        f"| message elements at the end | {r['dom_now']} |",
        f"| reached the oldest message | {'yes' if r['oldest_id'] else 'no'} |",
        f"| scroll newest → oldest (~{pages} page loads) | {r['up_seconds']:.1f} s |",
        f"| scroll oldest → newest | {r['down_seconds']:.1f} s |",
        f"| JS heap used: before / at the oldest / back at the newest | {heap_b:.1f} / "
        f"{heap_m:.1f} / {heap_a:.1f} MiB |",
        f"| DOM nodes: before / at the oldest / back at the newest | {r['nodes'][0]:.0f} / "
        f"{r['nodes'][1]:.0f} / {r['nodes'][2]:.0f} |",
        f"| first contentful paint, median of {len(r['fcp_ms'])} loads | "
        f"{statistics.median(r['fcp_ms']):.0f} ms |",
        f"| newest page rendered (history fetched + 50 messages in the DOM), median | "
        f"{statistics.median(r['rendered_ms']):.0f} ms |",
        f"| page weight, cold load ({r['weight']['requests']} requests): on the wire / decoded "
        f"| {r['weight']['wire'] / 1024:.1f} / {r['weight']['decoded'] / 1024:.1f} KiB |",
        "",
        f"Verdict: the DOM held at most {r['max_dom']} messages (cap {r['cap']}) for a "
        f"{args.ui_messages:,}-message session; the heap went from {heap_b:.1f} to "
        f"{heap_a:.1f} MiB over the full round trip.",
    ]
    return "\n".join(lines)
