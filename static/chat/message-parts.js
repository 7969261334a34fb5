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

// The line under the body, or null: { kind, action } with `kind` "streaming", "failed",
// "cancelled", "cut-length" or "cut-interrupted", `error` for a failed or cancelled one, and
// `action` ("retry", "continue") only on the newest reply (`isLast`).
export function stateLine(m, isLast) {
  if (m.status === "streaming") return { kind: "streaming", action: null };
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
