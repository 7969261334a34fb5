"""static/chat/window.js on its own (pure logic, no DOM), run in the browser as an ES module."""

from __future__ import annotations

from typing import Any

from tests.browser.conftest import LiveApp

SCENARIO = """async () => {
  const { MessageWindow } = await import('/static/chat/window.js');
  const page = (from, to, older, newer, live) => ({
    messages: Array.from({length: to - from + 1}, (_, i) => ({id: from + i})),
    older_cursor: older, newer_cursor: newer, at_live_edge: live,
  });
  const w = new MessageWindow({cap: 150});
  const out = {};
  w.reset(page(951, 1000, 'o951', 'n1000', true));
  // Scroll up four pages: the window never holds more than 150, the newest pages go.
  const dropped = [];
  for (let top = 901; top >= 751; top -= 50) {
    const change = w.prependOlder(page(top, top + 49, 'o' + top, 'n' + (top + 49), false));
    dropped.push(change.dropped.length);
  }
  out.afterUp = [w.count, w.messages[0].id, w.messages.at(-1).id, w.atLiveEdge, w.newerCursor];
  out.dropped = dropped;
  // Back down one page: the oldest page goes, the cursor on the new first page is kept.
  const down = w.appendNewer(page(901, 950, 'o901', 'n950', false));
  out.afterDown = [w.count, w.messages[0].id, w.olderCursor, down.dropped.length];
  // A live message off the edge is not added (the page offers "new messages" instead).
  out.offEdge = w.upsertLive({id: 1001}).offEdge === true;
  // At the edge it is, and a repeat updates in place.
  w.reset(page(951, 1000, 'o951', 'n1000', true));
  w.upsertLive({id: 1001, content: 'a'});
  w.upsertLive({id: 1001, content: 'ab'});
  out.live = [w.count, w.find(1001).content];
  // Overlapping pages never double a message.
  w.appendNewer(page(990, 1001, 'o990', 'n1001', true));
  out.noDup = new Set(w.messages.map(m => m.id)).size === w.count;
  // Truncation removes the message and everything after it.
  out.truncated = [w.truncateFrom(999).length, w.messages.at(-1).id, w.atLiveEdge];
  return out;
}"""


def test_window_logic(page: Any, app: LiveApp) -> None:
    page.goto(app.url + "/accounts/login/")
    out = page.evaluate(SCENARIO)
    assert out["dropped"] == [0, 0, 50, 50]
    assert out["afterUp"] == [150, 751, 900, False, "n900"]
    assert out["afterDown"] == [150, 801, "o801", 50]
    assert out["offEdge"] is True
    assert out["live"] == [51, "ab"]
    assert out["noDup"] is True
    assert out["truncated"] == [3, 998, True]
