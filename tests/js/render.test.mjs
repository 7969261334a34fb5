// The pure half of static/chat/render.js (message-parts.js) under Node: which body a message
// gets (only a finished reply's server-sanitised HTML is ever set as HTML), its state line and
// its buttons.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  TOOL_PREVIEW_CHARS,
  bodyKind,
  messageActions,
  stateLine,
  toolCallNames,
  toolPreview,
} from "../../static/chat/message-parts.js";

const html = "<p><strong>hi</strong></p>";

test("only a finished assistant reply with server HTML is rendered as Markdown", () => {
  assert.equal(bodyKind({ role: "assistant", status: "complete", content_html: html }), "markdown");
  assert.equal(bodyKind({ role: "assistant", status: "failed", content_html: html }), "markdown");
  assert.equal(bodyKind({ role: "assistant", status: "complete", content_html: "" }), "markdown");
});

test("everything else is set as text, whatever it carries", () => {
  // A streaming reply's HTML would be stale; the user's own text is never parsed.
  assert.equal(bodyKind({ role: "assistant", status: "streaming", content_html: html }), "plain");
  assert.equal(bodyKind({ role: "assistant", status: "complete" }), "plain");
  assert.equal(bodyKind({ role: "assistant", status: "complete", content_html: null }), "plain");
  assert.equal(bodyKind({ role: "user", status: "complete", content_html: html }), "plain");
  assert.equal(bodyKind({ role: "system", status: "complete", content_html: html }), "plain");
  assert.equal(bodyKind({ role: "tool", status: "complete", content_html: html }), "tool");
});

test("a tool result shows a bounded preview", () => {
  assert.equal(toolPreview("short"), "short");
  const exact = "x".repeat(TOOL_PREVIEW_CHARS);
  assert.equal(toolPreview(exact), exact);
  const long = "y".repeat(TOOL_PREVIEW_CHARS + 1);
  assert.equal(toolPreview(long), `${"y".repeat(TOOL_PREVIEW_CHARS)}…`);
});

test("the tools a reply called are named, unknown ones as ?", () => {
  assert.equal(toolCallNames({}), null);
  assert.equal(toolCallNames({ tool_calls: [] }), null);
  const calls = [{ function: { name: "search" } }, { name: "memory_get" }, {}];
  assert.equal(toolCallNames({ tool_calls: calls }), "search, memory_get, ?");
});

test("the state line says what happened; retry and continue only on the newest reply", () => {
  assert.equal(stateLine({ status: "complete", metadata: {} }, true), null);
  assert.deepEqual(stateLine({ status: "streaming" }, true), { kind: "streaming", action: null });
  assert.deepEqual(stateLine({ status: "failed", metadata: { error: "timeout" } }, true), {
    kind: "failed",
    error: "timeout",
    action: "retry",
  });
  assert.deepEqual(stateLine({ status: "cancelled" }, false), { kind: "cancelled", error: "", action: null });
  assert.deepEqual(stateLine({ status: "complete", metadata: { cut: "length" } }, true), {
    kind: "cut-length",
    action: "continue",
  });
  assert.deepEqual(stateLine({ status: "complete", metadata: { cut: "server" } }, false), {
    kind: "cut-interrupted",
    action: null,
  });
});

test("the buttons follow the role, the status and the newest reply", () => {
  const none = { isLast: false, canRemember: false };
  const last = { isLast: true, canRemember: false };
  assert.deepEqual(messageActions({ role: "user", status: "complete" }, none), ["copy", "edit"]);
  assert.deepEqual(messageActions({ role: "assistant", status: "complete" }, none), ["copy"]);
  assert.deepEqual(messageActions({ role: "assistant", status: "complete" }, last), ["copy", "regenerate"]);
  assert.deepEqual(messageActions({ role: "assistant", status: "failed" }, last), ["copy"]);
  assert.deepEqual(messageActions({ role: "assistant", status: "complete" }, { isLast: true, canRemember: true }), [
    "copy",
    "regenerate",
    "remember",
  ]);
  // Nothing to act on while a reply streams, nor on a tool's output.
  assert.deepEqual(messageActions({ role: "assistant", status: "streaming" }, { isLast: true, canRemember: true }), []);
  assert.deepEqual(messageActions({ role: "tool", status: "complete" }, { isLast: true, canRemember: true }), []);
});
