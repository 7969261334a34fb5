// One message as DOM: an <article id="m-<id>"> with its head, body, state line and actions.
// No state: what depends on the rest of the window (is this the newest reply?) is passed in.

import { el, t, timeElement } from "./dom.js";

// Tool output can be huge; the page shows a bounded preview (the model got it in full).
const TOOL_PREVIEW_CHARS = 4000;

export function roleLabel(role) {
  return { user: t("you"), assistant: t("assistant"), tool: t("tool"), system: t("system") }[role] || role;
}

function fillBody(body, m) {
  body.replaceChildren();
  if (m.role === "assistant" && m.status !== "streaming" && typeof m.content_html === "string") {
    // Sanitised on the server (chat/rendering.py: markdown-it without raw HTML, then nh3).
    body.innerHTML = m.content_html;
    body.classList.add("markdown");
    body.classList.remove("plain");
  } else if (m.role === "tool") {
    const text = m.content.length > TOOL_PREVIEW_CHARS ? `${m.content.slice(0, TOOL_PREVIEW_CHARS)}…` : m.content;
    body.append(el("details", {}, el("summary", { text: `${t("tool")} ${m.tool_call_id || ""}` }), el("pre", { text })));
  } else {
    body.textContent = m.content;
    body.classList.add("plain");
    body.classList.remove("markdown");
  }
  if (m.tool_calls && m.tool_calls.length) {
    const names = m.tool_calls.map((c) => (c.function && c.function.name) || c.name || "?").join(", ");
    body.append(el("p", { class: "tool-calls muted small", text: `→ ${names}` }));
  }
}

function actionButton(action, label) {
  return el("button", { type: "button", class: "msg-action", "data-action": action, text: label });
}

// `isLast`: the newest reply of the session is on screen (regenerate and retry belong to it
// only); `canRemember`: the session has an agent whose memory can take the message.
export function renderMessage(m, options) {
  const node = el("article", {
    class: `msg msg-${m.role}`,
    id: `m-${m.id}`,
    "data-message-id": m.id,
    "data-role": m.role,
    "data-status": m.status,
    tabindex: "-1",
  });
  updateMessageNode(node, m, options);
  return node;
}

export function updateMessageNode(node, m, { isLast, canRemember }) {
  node.dataset.status = m.status;
  const head = el("header", { class: "msg-head" }, el("span", { class: "msg-role", text: roleLabel(m.role) }), timeElement(m.created_at));
  const body = el("div", { class: "msg-body" });
  fillBody(body, m);
  const parts = [head, body];
  if (m.status === "streaming") {
    parts.push(el("p", { class: "msg-state streaming", role: "status", text: t("streaming") }));
  } else if (m.status === "failed" || m.status === "cancelled") {
    const error = m.metadata && m.metadata.error ? ` ${m.metadata.error}` : "";
    const state = el("p", { class: `msg-state ${m.status}`, role: "status" },
      document.createTextNode((m.status === "failed" ? t("status_failed") : t("status_cancelled")) + error));
    if (isLast) state.append(" ", actionButton("retry", t("retry")));
    parts.push(state);
  } else if (m.status === "complete" && m.metadata && m.metadata.cut) {
    // Kept as it came (the model's token limit, or a server that ended it early); the newest
    // can be continued: a new turn asking the model to go on.
    const text = m.metadata.cut === "length" ? t("reply_cut_length") : t("reply_cut_interrupted");
    const state = el("p", { class: "msg-state cut", role: "status" }, document.createTextNode(text));
    if (isLast) state.append(" ", actionButton("continue", t("continue")));
    parts.push(state);
  }
  if (m.status !== "streaming" && m.role !== "tool") {
    const actions = el("footer", { class: "msg-actions" }, actionButton("copy", t("copy")));
    if (m.role === "user") actions.append(actionButton("edit", t("edit")));
    if (m.role === "assistant" && m.status === "complete" && isLast) actions.append(actionButton("regenerate", t("regenerate")));
    if (canRemember) actions.append(actionButton("remember", t("remember")));
    parts.push(actions);
  }
  node.replaceChildren(...parts);
}

// While a reply streams only its text changes: plain text, so nothing the model sends is
// parsed as HTML here (the final render comes sanitised from the server).
export function updateStreamingText(node, m) {
  node.querySelector(".msg-body").textContent = m.content;
}
