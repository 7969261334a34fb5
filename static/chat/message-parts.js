// What one message shows, as data: which body, which state line, which actions. Pure (no DOM,
// no strings), so render.js builds the DOM from it and tests/js run it under Node.

// Tool output can be huge; the page shows a bounded preview (the model got it in full).
export const TOOL_PREVIEW_CHARS = 4000;

// "markdown": the server's HTML, sanitised there (chat/rendering.py: markdown-it without raw
// HTML, then nh3), and only for a finished reply; a streaming one is still its raw text.
// "tool": a bounded preview. "plain": the text, set as text.
export function bodyKind(m) {
  if (m.role === "assistant" && m.status !== "streaming" && typeof m.content_html === "string") return "markdown";
  if (m.role === "tool") return "tool";
  return "plain";
}

export function toolPreview(content) {
  return content.length > TOOL_PREVIEW_CHARS ? `${content.slice(0, TOOL_PREVIEW_CHARS)}…` : content;
}

// The tools a reply called ("a, b"), or null when it called none.
export function toolCallNames(m) {
  if (!m.tool_calls || !m.tool_calls.length) return null;
  return m.tool_calls.map((c) => (c.function && c.function.name) || c.name || "?").join(", ");
}

// The name of the tool a `tool` message answers: the call with its `tool_call_id` in the
// assistant rows of `messages`; `known` (the `tool_result` event's name) first. null: unknown
// (its call is outside the window).
export function toolNameFor(m, messages, known = null) {
  if (m.role !== "tool") return null;
  if (known) return known;
  if (!m.tool_call_id) return null;
  for (const x of messages) {
    if (x.role !== "assistant" || !x.tool_calls) continue;
    const call = x.tool_calls.find((c) => c.id === m.tool_call_id);
    if (call) return (call.function && call.function.name) || call.name || null;
  }
  return null;
}

// Assistant rows still `streaming` before reply row `id`: a reply is one at a time, so once
// row `id` streams or ends, those rounds are over. The server completes a tool round's row
// (tool_calls) before it opens the next one and sends no event for it; any other such row
// is stale and must be read again.
export function roundsOver(messages, id) {
  return messages.filter((x) => x.role === "assistant" && x.status === "streaming" && x.id < id);
}

// A finished message this long is folded, with "Show more" (a 20,000-character paste is
// otherwise thousands of pixels of scrolling); a streaming one never is.
export const FOLD_CHARS = 3000;
export const FOLD_LINES = 50;

export function isLong(m) {
  if (m.status === "streaming" || m.role === "tool" || !m.content) return false;
  if (m.content.length > FOLD_CHARS) return true;
  let lines = 1;
  for (let i = m.content.indexOf("\n"); i >= 0 && lines <= FOLD_LINES; i = m.content.indexOf("\n", i + 1)) lines += 1;
  return lines > FOLD_LINES;
}

// The line under the body, or null: { kind, action } with `kind` "streaming", "tools" (a round
// waiting for its tool calls, `names`), "failed", "cancelled", "cut-length" or
// "cut-interrupted", `error` for a failed or cancelled one, and `action` ("retry", "continue")
// only on the newest reply (`isLast`).
export function stateLine(m, isLast) {
  if (m.status === "streaming") {
    const names = toolCallNames(m);
    return names ? { kind: "tools", names, action: null } : { kind: "streaming", action: null };
  }
  if (m.status === "failed" || m.status === "cancelled") {
    const error = m.metadata && m.metadata.error ? m.metadata.error : "";
    return { kind: m.status, error, action: isLast ? "retry" : null };
  }
  if (m.status === "complete" && m.metadata && m.metadata.cut) {
    // Kept as it came (the model's token limit, or a server that ended it early); the newest
    // can be continued: a new turn asking the model to go on.
    const kind = m.metadata.cut === "length" ? "cut-length" : "cut-interrupted";
    return { kind, action: isLast ? "continue" : null };
  }
  return null;
}

// The buttons under a message, in order. Regenerate belongs to the newest reply only;
// `canRemember`: the session has an agent whose memory can take the message.
export function messageActions(m, { isLast, canRemember }) {
  if (m.status === "streaming" || m.role === "tool") return [];
  const actions = ["copy"];
  if (m.role === "user") actions.push("edit");
  if (m.role === "assistant" && m.status === "complete" && isLast) actions.push("regenerate");
  if (canRemember) actions.push("remember");
  return actions;
}
