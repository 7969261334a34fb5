// One message as DOM: an <article id="m-<id>"> with its head, body, state line and actions.
// No state: what depends on the rest of the window (is this the newest reply?) is passed in.

import { decorateCodeBlocks } from "./codeblocks.js";
import { el, t, timeElement } from "./dom.js";
import { bodyKind, messageActions, stateLine, toolCallNames, toolPreview } from "./message-parts.js";

export function roleLabel(role) {
  return { user: t("you"), assistant: t("assistant"), tool: t("tool"), system: t("system") }[role] || role;
}

function fillBody(body, m) {
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
    body.append(el("details", {}, el("summary", { text: `${t("tool")} ${m.tool_call_id || ""}` }), el("pre", { text })));
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
  const css = line.kind.startsWith("cut-") ? "cut" : line.kind;
  const error = line.error ? ` ${line.error}` : "";
  const node = el("p", { class: `msg-state ${css}`, role: "status" }, document.createTextNode(t(STATE_TEXT[line.kind]) + error));
  if (line.action) node.append(" ", actionButton(line.action, t(line.action)));
  return node;
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
