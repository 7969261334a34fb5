// static/chat/ring.js under Node: the usage ring's level thresholds and what it draws.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ringLevel, updateRing } from "../../static/chat/ring.js";

test("at the default threshold the ring turns amber at 70 and red at 88", () => {
  assert.equal(ringLevel(0, 88), "ok");
  assert.equal(ringLevel(69.9, 88), "ok");
  assert.equal(ringLevel(70, 88), "warn");
  assert.equal(ringLevel(87.9, 88), "warn");
  assert.equal(ringLevel(88, 88), "danger");
  assert.equal(ringLevel(100, 88), "danger");
});

test("another threshold moves amber with it", () => {
  // 50 * 70 / 88 = 39.77...
  assert.equal(ringLevel(39.7, 50), "ok");
  assert.equal(ringLevel(39.8, 50), "warn");
  assert.equal(ringLevel(50, 50), "danger");
});

// The ring's markup (templates/chat/chat.html) reduced to what updateRing touches.
function fakeRing() {
  const node = () => ({ attrs: {}, textContent: "", setAttribute(k, v) { this.attrs[k] = v; } });
  const parts = { "#ring-value": node(), "#ring-pct": node(), "#ring-tip": node(), "#ring-btn": node() };
  return { dataset: {}, parts, querySelector: (selector) => parts[selector] };
}

const format = (b) => `${b.used_runes} of ${b.limit_runes}`;

test("the arc, the label and the level follow used_pct, clamped to 0..100", () => {
  const root = fakeRing();
  updateRing(root, { used_pct: 72.25, used_runes: 7225, limit_runes: 10000 }, { thresholdPct: 88, format });
  assert.equal(root.parts["#ring-value"].attrs["stroke-dasharray"], "72.3 27.8");
  assert.equal(root.parts["#ring-value"].attrs.visibility, "visible");
  assert.equal(root.parts["#ring-pct"].textContent, "72%");
  assert.equal(root.dataset.level, "warn");
  assert.equal(root.dataset.usedPct, "72.25");
  assert.equal(root.parts["#ring-tip"].textContent, "7225 of 10000");
  // The name starts with what the button shows.
  assert.equal(root.parts["#ring-btn"].attrs["aria-label"], "72% — 7225 of 10000");

  updateRing(root, { used_pct: 140 }, { thresholdPct: 88, format });
  assert.equal(root.parts["#ring-value"].attrs["stroke-dasharray"], "100.0 0.0");
  assert.equal(root.parts["#ring-pct"].textContent, "100%");
  assert.equal(root.dataset.level, "danger");
});

test("an empty ring draws no dot", () => {
  const root = fakeRing();
  updateRing(root, { used_pct: 0.4 }, { thresholdPct: 88, format });
  assert.equal(root.parts["#ring-value"].attrs.visibility, "hidden");
  updateRing(root, { used_pct: "not a number" }, { thresholdPct: 88, format });
  assert.equal(root.parts["#ring-pct"].textContent, "0%");
  assert.equal(root.dataset.level, "ok");
});

test("a budget's own threshold wins over the page's", () => {
  const root = fakeRing();
  updateRing(root, { used_pct: 55, threshold_pct: 50 }, { thresholdPct: 88, format });
  assert.equal(root.dataset.level, "danger");
  assert.equal(root.dataset.thresholdPct, "50");
  updateRing(root, { used_pct: 55 }, { thresholdPct: 88, format });
  assert.equal(root.dataset.level, "ok");
  assert.equal(root.dataset.thresholdPct, "88");
});

test("nothing happens without a ring or a budget", () => {
  const root = fakeRing();
  updateRing(null, { used_pct: 50 }, { thresholdPct: 88, format });
  updateRing(root, null, { thresholdPct: 88, format });
  assert.deepEqual(root.dataset, {});
});
