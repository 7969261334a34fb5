// static/chat/snippet.js under Node: a search snippet's highlights, merged and clamped, so the
// snippet is always its own text, once, in order.
import assert from "node:assert/strict";
import { test } from "node:test";

import { snippetParts } from "../../static/chat/snippet.js";

const joined = (parts) => parts.map((p) => p.text).join("");
const marked = (parts) => parts.filter((p) => p.marked).map((p) => p.text);

test("highlights become marked runs between plain ones", () => {
  const parts = snippetParts("the quick fox", [[4, 9]]);
  assert.deepEqual(parts, [
    { text: "the ", marked: false },
    { text: "quick", marked: true },
    { text: " fox", marked: false },
  ]);
});

test("offsets count code points, not UTF-16 units", () => {
  const parts = snippetParts("🙂 你好 world", [[2, 4]]);
  assert.deepEqual(marked(parts), ["你好"]);
  assert.equal(joined(parts), "🙂 你好 world");
});

test("overlapping and unsorted highlights merge; text is never repeated", () => {
  const parts = snippetParts("abcdefghij", [[6, 8], [1, 4], [3, 5]]);
  assert.deepEqual(marked(parts), ["bcde", "gh"]);
  assert.equal(joined(parts), "abcdefghij");
});

test("bad pairs are clamped or ignored instead of throwing", () => {
  const parts = snippetParts("short", [[-3, 2], [4, 99], [3, 3], [5, 1]]);
  assert.deepEqual(marked(parts), ["sh", "t"]);
  assert.equal(joined(parts), "short");
  assert.deepEqual(snippetParts("plain", null), [{ text: "plain", marked: false }]);
  assert.deepEqual(snippetParts("", [[0, 1]]), []);
});

test("markup in a snippet stays text", () => {
  const parts = snippetParts("<img src=x onerror=alert(1)>", [[1, 4]]);
  assert.deepEqual(marked(parts), ["img"]);
  assert.equal(joined(parts), "<img src=x onerror=alert(1)>");
});
