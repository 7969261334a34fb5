// static/chat/window.js under Node: the bounded window's paging math (docs/architecture.md,
// "Paging: bounded window in the browser").
import assert from "node:assert/strict";
import { test } from "node:test";

import { MessageWindow } from "../../static/chat/window.js";

// A history page of messages `from`..`to`, as /api/v1/chat/history answers it.
const page = (from, to, { older = `o${from}`, newer = `n${to}`, live = false } = {}) => ({
  messages: Array.from({ length: to - from + 1 }, (_, i) => ({ id: from + i })),
  older_cursor: older,
  newer_cursor: newer,
  at_live_edge: live,
});

const ids = (w) => w.messages.map((m) => m.id);
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test("an empty window is at the live edge with no cursors", () => {
  const w = new MessageWindow({ cap: 150 });
  assert.equal(w.count, 0);
  assert.equal(w.olderCursor, null);
  assert.equal(w.newerCursor, null);
  assert.equal(w.atLiveEdge, true);
});

test("scrolling up drops whole pages from the newest side once past the cap", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(951, 1000, { live: true }));
  const dropped = [];
  for (let top = 901; top >= 751; top -= 50) dropped.push(w.prependOlder(page(top, top + 49)).dropped.length);
  assert.deepEqual(dropped, [0, 0, 50, 50]);
  assert.equal(w.count, 150);
  assert.deepEqual([w.messages[0].id, w.messages.at(-1).id], [751, 900]);
  // The page now at the bottom keeps its own cursor, and the window knows it left the edge.
  assert.equal(w.newerCursor, "n900");
  assert.equal(w.atLiveEdge, false);
});

test("scrolling back down drops the oldest page and keeps the new first page's cursor", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(801, 850));
  w.appendNewer(page(851, 900));
  w.appendNewer(page(901, 950));
  const change = w.appendNewer(page(951, 1000, { live: true }));
  assert.deepEqual(change.dropped.map((m) => m.id), range(801, 850));
  assert.equal(w.count, 150);
  assert.equal(w.olderCursor, "o851");
  assert.equal(w.atLiveEdge, true);
});

test("pages go until the cap holds, but the last page stays whatever its size", () => {
  const w = new MessageWindow({ cap: 10 });
  w.reset(page(1, 30, { live: true }));
  assert.equal(w.count, 30);
  let change = w.prependOlder(page(-9, 0));
  assert.deepEqual(change.dropped.map((m) => m.id), range(1, 30));
  assert.deepEqual(ids(w), range(-9, 0));
  change = w.prependOlder(page(-29, -10));
  assert.deepEqual(change.dropped.map((m) => m.id), range(-9, 0));
  assert.equal(w.count, 20);
  assert.equal(w.olderCursor, "o-29");
});

test("an empty older page only records that nothing lies beyond", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(1, 50, { live: true }));
  const change = w.prependOlder({ messages: [], older_cursor: null, newer_cursor: null, at_live_edge: false });
  assert.deepEqual(change, { added: [], updated: [], dropped: [] });
  assert.equal(w.olderCursor, null);
  assert.equal(w.count, 50);
  assert.equal(w.atLiveEdge, true);
});

test("overlapping pages update messages in place instead of doubling them", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(1, 10, { live: true }));
  const overlap = page(8, 12, { live: true });
  overlap.messages[0].content = "edited";
  const change = w.appendNewer(overlap);
  assert.deepEqual(change.added.map((m) => m.id), [11, 12]);
  assert.deepEqual(change.updated.map((m) => m.id), [8, 9, 10]);
  assert.equal(w.find(8).content, "edited");
  assert.equal(new Set(ids(w)).size, w.count);
});

test("a live message joins only at the live edge, in id order", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(1, 5, { newer: null, live: true }));
  w.upsertLive({ id: 7 });
  w.upsertLive({ id: 6 }); // two events crossed
  assert.deepEqual(ids(w), [1, 2, 3, 4, 5, 6, 7]);
  const repeat = w.upsertLive({ id: 7, content: "more" });
  assert.deepEqual(repeat.added, []);
  assert.equal(w.find(7).content, "more");
  w.reset(page(1, 5));
  assert.deepEqual(w.upsertLive({ id: 8 }), { added: [], updated: [], dropped: [], overflow: false, offEdge: true });
  assert.equal(w.has(8), false);
});

test("a live page past the cap on its own asks for a reload", () => {
  const w = new MessageWindow({ cap: 3 });
  w.reset(page(1, 3, { live: true }));
  assert.equal(w.upsertLive({ id: 4 }).overflow, true);
});

test("truncation removes the message and everything after it and returns to the edge", () => {
  const w = new MessageWindow({ cap: 150 });
  w.reset(page(1, 50));
  w.appendNewer(page(51, 100));
  const removed = w.truncateFrom(40);
  assert.equal(removed.length, 61);
  assert.equal(w.messages.at(-1).id, 39);
  assert.equal(w.pages.length, 1);
  assert.equal(w.atLiveEdge, true);
});
