// static/chat/latest.js and the reply helpers of message-parts.js under Node.
import assert from "node:assert/strict";
import { test } from "node:test";

import { latestButton } from "../../static/chat/latest.js";
import { isLong, roundsOver, stateLine, toolNameFor, FOLD_CHARS } from "../../static/chat/message-parts.js";

test("New messages only when something arrived; Jump to latest after a jump", () => {
  // After a jump away from the live edge nothing is new: only the way back.
  assert.equal(latestButton({ atLiveEdge: false, nearBottom: false, far: true, unseen: false }), "jump");
  assert.equal(latestButton({ atLiveEdge: false, nearBottom: true, far: false, unseen: false }), "jump");
  // Something arrived meanwhile.
  assert.equal(latestButton({ atLiveEdge: false, nearBottom: false, far: true, unseen: true }), "new");
  assert.equal(latestButton({ atLiveEdge: true, nearBottom: false, far: false, unseen: true }), "new");
  // Scrolled up a little at the live edge: nothing; a screen or more: the way back.
  assert.equal(latestButton({ atLiveEdge: true, nearBottom: false, far: false, unseen: false }), null);
  assert.equal(latestButton({ atLiveEdge: true, nearBottom: false, far: true, unseen: false }), "jump");
  // At the bottom of the newest page: nothing, whatever arrived.
  assert.equal(latestButton({ atLiveEdge: true, nearBottom: true, far: false, unseen: true }), null);
});

const call = (id, name) => ({ id, type: "function", function: { name, arguments: "{}" } });

test("a tool message is named by the call it answers", () => {
  const messages = [
    { id: 1, role: "user", content: "time?" },
    { id: 2, role: "assistant", status: "complete", tool_calls: [call("call_2_0", "current_time"), call("call_2_1", "memory_write")] },
    { id: 3, role: "tool", tool_call_id: "call_2_1", content: "saved" },
  ];
  assert.equal(toolNameFor(messages[2], messages), "memory_write");
  assert.equal(toolNameFor({ id: 9, role: "tool", tool_call_id: "elsewhere" }, messages), null);
  assert.equal(toolNameFor({ id: 9, role: "tool", tool_call_id: "elsewhere" }, messages, "history_search"), "history_search");
  assert.equal(toolNameFor(messages[1], messages), null);
});

test("a round waiting for its tools says so; later rows end the earlier rounds", () => {
  const round = { id: 5, role: "assistant", status: "streaming", content: "", tool_calls: [call("c", "current_time")] };
  assert.deepEqual(stateLine(round, true), { kind: "tools", names: "current_time", action: null });
  assert.deepEqual(stateLine({ ...round, tool_calls: null }, true), { kind: "streaming", action: null });
  const messages = [
    { id: 4, role: "user", status: "complete" },
    round,
    { id: 6, role: "tool", status: "complete" },
    { id: 7, role: "assistant", status: "streaming" },
  ];
  assert.deepEqual(roundsOver(messages, 7).map((m) => m.id), [5]);
  assert.deepEqual(roundsOver(messages, 5), []);
});

test("long finished messages fold, streaming and short ones never", () => {
  const long = "x".repeat(FOLD_CHARS + 1);
  assert.equal(isLong({ role: "user", status: "complete", content: long }), true);
  assert.equal(isLong({ role: "assistant", status: "streaming", content: long }), false);
  assert.equal(isLong({ role: "tool", status: "complete", content: long }), false);
  assert.equal(isLong({ role: "assistant", status: "complete", content: "short" }), false);
  assert.equal(isLong({ role: "assistant", status: "complete", content: "line\n".repeat(60) }), true);
});
