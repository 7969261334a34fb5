// One message as DOM: an <article id="m-<id>"> with its head, body, state line and actions.
// No state: what depends on the rest of the window (is this the newest reply?) is passed in.

import { decorateCodeBlocks } from "./codeblocks.js";
import { el, t, timeElement } from "./dom.js";
import { bodyKind, messageActions, stateLine, toolCallNames, toolPreview } from "./message-parts.js";

export function roleLabel(role) {
  return { user: t("you"), assistant: t("assistant"), tool: t("tool"), system: t("system") }[role] || role;
}

// `toolName`: the tool a `tool` message answers (null when its call is not known here).
function fillBody(body, m, toolName) {
  body.replaceChildren();
  const kind = bodyKind(m);
  if (kind === "markdown") {
    // Sanitised on the server (chat/rendering.py: markdown-it without raw HTML, then nh3).
    body.innerHTML = m.content_html;
    decorateCodeBlocks(body);
    body.classList.add("markdown");
    body.classList.remove("plain");
  } else if (kind === "tool") {
    const text = toolPreview(m.content);
    const label = toolName ? t("tool_named", { name: toolName }) : t("tool");
    body.append(el("details", {}, el("summary", { text: label }), el("pre", { text })));
  } else {
    body.textContent = m.content;
    body.classList.add("plain");
    body.classList.remove("markdown");
  }
  const names = toolCallNames(m);
  if (names) body.append(el("p", { class: "tool-calls muted small", text: `→ ${names}` }));
}

function actionButton(action, label) {
  return el("button", { type: "button", class: "msg-action", "data-action": action, text: label });
}

const STATE_TEXT = {
  failed: "status_failed",
  cancelled: "status_cancelled",
  "cut-length": "reply_cut_length",
  "cut-interrupted": "reply_cut_interrupted",
};

function stateNode(line) {
  if (line.kind === "streaming") return el("p", { class: "msg-state streaming", role: "status", text: t("streaming") });
  if (line.kind === "tools") {
    return el("p", { class: "msg-state streaming tools", role: "status", text: t("tools_running", { names: line.names }) });
  }
  const css = line.kind.startsWith("cut-") ? "cut" : line.kind;
  const error = line.error ? ` ${line.error}` : "";
  const node = el("p", { class: `msg-state ${css}`, role: "status" }, document.createTextNode(t(STATE_TEXT[line.kind]) + error));
  if (line.action) node.append(" ", actionButton(line.action, t(line.action)));
  return node;
}

// `isLast`: the newest reply of the session is on screen (regenerate and retry belong to it
// only); `canRemember`: the session has an agent whose memory can take the message;
// `toolName`: what a tool message answers; `memory`: this turn wrote the agent's memory;
// `folded`: a long message shows its beginning and "Show more" (null: not long).
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

function memoryChip() {
  return el("button", { type: "button", class: "chip memory-chip", "data-action": "open-memory", text: t("memory_updated") });
}

function foldButton(m, folded) {
  return el("button", {
    type: "button",
    class: "msg-action fold-btn",
    "data-action": "fold",
    "aria-expanded": String(!folded),
    "aria-controls": `b-${m.id}`,
    text: folded ? t("show_more") : t("show_less"),
  });
}

export function updateMessageNode(node, m, { isLast, canRemember, toolName = null, memory = false, folded = null }) {
  node.dataset.status = m.status;
  const head = el("header", { class: "msg-head" }, el("span", { class: "msg-role", text: roleLabel(m.role) }),
    timeElement(m.created_at), memory ? memoryChip() : null);
  const body = el("div", { class: folded ? "msg-body folded" : "msg-body", id: `b-${m.id}` });
  fillBody(body, m, toolName);
  const parts = [head, body];
  if (folded !== null) parts.push(foldButton(m, folded));
  const line = stateLine(m, isLast);
  if (line) parts.push(stateNode(line));
  const actions = messageActions(m, { isLast, canRemember });
  if (actions.length) parts.push(el("footer", { class: "msg-actions" }, ...actions.map((a) => actionButton(a, t(a)))));
  node.replaceChildren(...parts);
}

// While a reply streams only its text changes: plain text, so nothing the model sends is
// parsed as HTML here (the final render comes sanitised from the server).
export function updateStreamingText(node, m) {
  node.querySelector(".msg-body").textContent = m.content;
}
