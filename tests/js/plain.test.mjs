// static/chat/plain.js under Node: Markdown marks left out of snippets and previews, every
// other character kept, highlights still on the same words.
import assert from "node:assert/strict";
import { test } from "node:test";

import { plainMask, plainParts, plainText } from "../../static/chat/plain.js";
import { snippetParts } from "../../static/chat/snippet.js";

test("emphasis, code, headings, quotes, bullets and links lose their marks", () => {
  assert.equal(plainText("a **demo** of `code` and _this_"), "a demo of code and this");
  assert.equal(plainText("# Title\n> quoted\n- item\n* other"), "Title quoted item other");
  assert.equal(plainText("see [the docs](https://example.com/x) and ![pic](a.png)"), "see the docs and pic");
  assert.equal(plainText("~~gone~~ stays"), "gone stays");
  assert.equal(plainText("**粗体**和`代码`"), "粗体和代码");
});

test("what only looks like a mark stays", () => {
  assert.equal(plainText("2 * 3 = 6"), "2 * 3 = 6");
  assert.equal(plainText("snake_case_name"), "snake_case_name");
  assert.equal(plainText("a ~ b"), "a ~ b");
  assert.equal(plainText("[not a link] (x)"), "[not a link] (x)");
  assert.equal(plainText("#hashtag"), "#hashtag");
  // Unpaired underscores belong to a name.
  assert.equal(plainText("look window.__xss++ here"), "look window.__xss++ here");
  assert.equal(plainText("call _private and more"), "call _private and more");
});

test("an unclosed mark cut off by a snippet's edge still goes", () => {
  assert.equal(plainText("…the **demo was"), "…the demo was");
  assert.equal(plainText("it was great** said"), "it was great said");
});

test("the mask keeps one entry per code point", () => {
  const text = "😀 **x**";
  assert.equal(plainMask(text).length, Array.from(text).length);
  assert.deepEqual(plainMask("**x**"), [false, false, true, false, false]);
});

test("highlights keep covering their words once the marks are out", () => {
  const snippet = "run the **demo** now";
  const parts = plainParts(snippetParts(snippet, [[10, 14]]));
  assert.deepEqual(parts, [
    { text: "run the ", marked: false },
    { text: "demo", marked: true },
    { text: " now", marked: false },
  ]);
  // A highlight over the marks themselves leaves nothing empty behind.
  const whole = plainParts(snippetParts(snippet, [[8, 16]]));
  assert.deepEqual(whole.map((p) => p.text).join(""), "run the demo now");
  assert.ok(whole.every((p) => p.text.length > 0));
});
