// The chat page: sessions sidebar, bounded message window, turn navigator, streaming, ring.
// Everything the page needs from the server comes from the JSON block #cadau-config (never
// executed, so the CSP can forbid inline scripts) and from /api/v1 + /ws/chat/.

import { api, streamPost } from "./api.js";
import { updateRing } from "./ring.js";
import { ChatSocket } from "./socket.js";
import { MessageWindow } from "./window.js";

const config = JSON.parse(document.getElementById("cadau-config").textContent);
const S = config.strings;
const $ = (id) => document.getElementById(id);

// "%(name)s" placeholders, as in the Python catalog the strings come from.
function t(key, vars = {}) {
  const text = S[key] ?? key;
  return text.replace(/%\((\w+)\)s/g, (_, name) => String(vars[name] ?? "")).replace(/%%/g, "%");
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

const numberFormat = new Intl.NumberFormat(config.language);
const timeFormat = new Intl.DateTimeFormat(config.language, { dateStyle: "medium", timeStyle: "short" });

let noticeTimer = null;
function notice(text, { sticky = false, level = "info" } = {}) {
  const box = $("notice");
  if (!box) return;
  box.textContent = text;
  box.dataset.level = level;
  box.hidden = false;
  clearTimeout(noticeTimer);
  if (!sticky) noticeTimer = setTimeout(() => (box.hidden = true), 6000);
}

function clearNotice() {
  const box = $("notice");
  if (box) box.hidden = true;
}

// --- Phone width: the sidebar and panels slide over the chat -------------------------------

function setupNarrowLayout() {
  const layout = $("layout");
  const scrim = $("scrim");
  const close = () => {
    layout.classList.remove("sidebar-open");
    scrim.hidden = true;
  };
  $("open-sidebar")?.addEventListener("click", () => {
    layout.classList.add("sidebar-open");
    scrim.hidden = false;
    $("new-chat").focus();
  });
  $("close-sidebar")?.addEventListener("click", close);
  scrim.addEventListener("click", close);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      close();
      for (const id of ["turns-panel", "memory-panel"]) {
        if ($(id) && !$(id).hidden) togglePanel(id, false);
      }
    }
  });
}

function togglePanel(id, force) {
  const panel = $(id);
  const button = $(id === "turns-panel" ? "toggle-turns" : "toggle-memory");
  const show = force ?? panel.hidden;
  panel.hidden = !show;
  button?.setAttribute("aria-expanded", String(show));
  $("layout").classList.toggle("panel-open", !$("turns-panel").hidden || !$("memory-panel").hidden);
  return show;
}

// --- Sessions sidebar ---------------------------------------------------------------------

const sessions = { cursor: undefined, loading: false, done: false };

function sessionItem(s) {
  const active = config.session && s.id === config.session.id;
  const link = el("a", {
    href: `/chat/${s.id}/`,
    class: "session-link",
    "aria-current": active ? "page" : null,
    text: s.title || t("untitled"),
  });
  const actions = el(
    "span",
    { class: "session-actions" },
    el("button", { type: "button", class: "icon-btn", "data-action": "rename", "aria-label": `${t("rename")}: ${s.title || t("untitled")}`, title: t("rename"), text: "✎" }),
    el("button", { type: "button", class: "icon-btn", "data-action": "delete", "aria-label": `${t("delete")}: ${s.title || t("untitled")}`, title: t("delete"), text: "✕" }),
  );
  return el("li", { class: active ? "session active" : "session", "data-session-id": s.id }, link, actions);
}

async function loadSessions() {
  if (sessions.loading || sessions.done) return;
  sessions.loading = true;
  try {
    const page = await api.sessions(sessions.cursor);
    const list = $("session-list");
    for (const s of page.results) list.append(sessionItem(s));
    sessions.cursor = page.next_cursor;
    sessions.done = !page.next_cursor;
    $("session-status").textContent = list.children.length ? "" : t("no_sessions");
  } catch {
    $("session-status").textContent = t("load_error");
  } finally {
    sessions.loading = false;
  }
  // Keep loading until the list overflows (a tall screen shows more than 20).
  const box = $("session-scroll");
  if (!sessions.done && box.scrollHeight <= box.clientHeight + 200) loadSessions();
}

function setupSidebar() {
  const box = $("session-scroll");
  box.addEventListener("scroll", () => {
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 300) loadSessions();
  });
  $("session-list").addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-action]");
    if (!button) return;
    const li = button.closest("li[data-session-id]");
    const id = Number(li.dataset.sessionId);
    const link = li.querySelector(".session-link");
    if (button.dataset.action === "rename") {
      const title = window.prompt(t("rename_prompt"), link.textContent);
      if (!title || !title.trim()) return;
      const updated = await api.renameSession(id, title.trim());
      link.textContent = updated.title;
      if (config.session && config.session.id === id) {
        $("chat-title").textContent = updated.title;
        document.title = `${updated.title} · Cadau`;
      }
    } else if (button.dataset.action === "delete") {
      if (!window.confirm(t("confirm_delete"))) return;
      await api.deleteSession(id);
      if (config.session && config.session.id === id) {
        window.location.assign("/");
        return;
      }
      li.remove();
    }
  });
  $("new-chat-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const agent = $("agent-select").value;
    const body = agent ? { agent_id: Number(agent) } : {};
    const created = await api.createSession(body);
    window.location.assign(`/chat/${created.id}/`);
  });
  loadSessions();
}

async function setupAgents() {
  if (!config.features.agents) return;
  try {
    const data = await api.agents();
    const agents = Array.isArray(data) ? data : data.results || data.agents || [];
    if (!agents.length) return;
    const select = $("agent-select");
    for (const a of agents) select.append(el("option", { value: a.id, text: a.name }));
    $("agent-picker").hidden = false;
  } catch {
    // No agents API (yet): the picker stays hidden.
  }
}

// --- The chat -----------------------------------------------------------------------------

const chat = {
  id: config.session ? config.session.id : null,
  agentId: config.session ? config.session.agent_id : null,
  win: new MessageWindow({ cap: config.window_cap }),
  pageSize: config.page_size,
  // One page load at a time, and none applied across a reset (jump, back to newest): a page is
  // only ever joined to the window it was requested for, so the window stays contiguous.
  loading: false,
  generation: 0,
  socket: null,
  sse: null, // AbortController of a REST stream in flight
  streamingId: null,
  pendingText: new Map(), // message_id -> text of deltas that arrived before their message
};
// For tests, the benchmark and the curious: the window state, read-only by convention.
window.cadau = chat;

const scroller = () => $("messages");
const list = () => $("message-list");

function nearBottom(px = 80) {
  const box = scroller();
  return box.scrollHeight - box.scrollTop - box.clientHeight < px;
}

function scrollToBottom() {
  const box = scroller();
  box.scrollTop = box.scrollHeight;
}

// Keep the first visible message where it is on screen across any DOM change above or below.
function withAnchor(mutate) {
  const box = scroller();
  const top = box.scrollTop;
  let anchor = null;
  let offset = 0;
  for (const node of list().children) {
    if (node.offsetTop + node.offsetHeight > top) {
      anchor = node;
      offset = node.offsetTop - top;
      break;
    }
  }
  mutate();
  if (anchor && anchor.isConnected) box.scrollTop = anchor.offsetTop - offset;
}

function roleLabel(role) {
  return { user: t("you"), assistant: t("assistant"), tool: t("tool"), system: t("system") }[role] || role;
}

function isLastAssistant(m) {
  const all = chat.win.messages;
  return chat.win.atLiveEdge && all.length && all[all.length - 1].id === m.id && m.role === "assistant";
}

function fillBody(body, m) {
  body.replaceChildren();
  if (m.role === "assistant" && m.status !== "streaming" && typeof m.content_html === "string") {
    // Sanitised on the server (chat/rendering.py: markdown-it without raw HTML, then nh3).
    body.innerHTML = m.content_html;
    body.classList.add("markdown");
    body.classList.remove("plain");
  } else if (m.role === "tool") {
    // Tool output can be huge; the page shows a bounded preview (the model got it in full).
    const text = m.content.length > 4000 ? `${m.content.slice(0, 4000)}…` : m.content;
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

function renderMessage(m) {
  const node = el("article", {
    class: `msg msg-${m.role}`,
    id: `m-${m.id}`,
    "data-message-id": m.id,
    "data-role": m.role,
    "data-status": m.status,
    tabindex: "-1",
  });
  updateMessageNode(node, m);
  return node;
}

function updateMessageNode(node, m) {
  node.dataset.status = m.status;
  const created = new Date(m.created_at);
  const head = el(
    "header",
    { class: "msg-head" },
    el("span", { class: "msg-role", text: roleLabel(m.role) }),
    el("time", { datetime: m.created_at, text: Number.isNaN(created.getTime()) ? "" : timeFormat.format(created) }),
  );
  const body = el("div", { class: "msg-body" });
  fillBody(body, m);
  const parts = [head, body];
  if (m.status === "streaming") {
    parts.push(el("p", { class: "msg-state streaming", role: "status", text: t("streaming") }));
  } else if (m.status === "failed" || m.status === "cancelled") {
    const error = m.metadata && m.metadata.error ? ` ${m.metadata.error}` : "";
    const state = el("p", { class: `msg-state ${m.status}`, role: "status" },
      document.createTextNode((m.status === "failed" ? t("status_failed") : t("status_cancelled")) + error));
    if (isLastAssistant(m)) state.append(" ", actionButton("retry", t("retry")));
    parts.push(state);
  }
  if (m.status !== "streaming" && m.role !== "tool") {
    const actions = el("footer", { class: "msg-actions" }, actionButton("copy", t("copy")));
    if (m.role === "user") actions.append(actionButton("edit", t("edit")));
    if (m.role === "assistant" && m.status === "complete" && isLastAssistant(m)) {
      actions.append(actionButton("regenerate", t("regenerate")));
    }
    if (chat.agentId && config.features.agents) actions.append(actionButton("remember", t("remember")));
    parts.push(actions);
  }
  node.replaceChildren(...parts);
}

function nodeFor(id) {
  return document.getElementById(`m-${id}`);
}

// Apply a window change to the DOM: drop, add in id order, refresh updated ones.
function applyChange({ added = [], updated = [], dropped = [], removed = [] }) {
  for (const m of [...dropped, ...removed]) nodeFor(m.id)?.remove();
  const container = list();
  for (const m of added) {
    const node = renderMessage(m);
    // Usually a whole block goes on one end; find the first shown message with a larger id.
    let before = null;
    const first = container.firstElementChild;
    if (first && Number(first.dataset.messageId) > m.id) before = first;
    else if (container.lastElementChild && Number(container.lastElementChild.dataset.messageId) > m.id) {
      before = [...container.children].find((n) => Number(n.dataset.messageId) > m.id) || null;
    }
    container.insertBefore(node, before);
  }
  for (const m of updated) {
    const node = nodeFor(m.id);
    if (node) updateMessageNode(node, m);
  }
  refreshLastActions();
  $("messages").dataset.count = String(container.children.length);
  const empty = !container.children.length;
  $("messages").classList.toggle("is-empty", empty);
}

// Regenerate / retry belong to the newest reply only; re-render the last two assistant nodes.
let lastAssistantShown = null;
function refreshLastActions() {
  const all = chat.win.messages;
  const last = all.length ? all[all.length - 1] : null;
  const current = last && last.role === "assistant" ? last.id : null;
  if (current === lastAssistantShown) return;
  for (const id of [lastAssistantShown, current]) {
    const m = id && chat.win.find(id);
    const node = id && nodeFor(id);
    if (m && node) updateMessageNode(node, m);
  }
  lastAssistantShown = current;
}

function firstPaint() {
  document.documentElement.dataset.firstRender = String(Math.round(performance.now()));
}

function resetWindow(data) {
  chat.generation += 1;
  chat.win.reset(data);
  // Rebuild the list outright: nothing of the previous window may linger in the DOM.
  list().replaceChildren();
  lastAssistantShown = null;
  applyChange({ added: chat.win.messages });
}

async function openNewest() {
  const data = await api.history(chat.id, { limit: chat.pageSize });
  resetWindow(data);
  scrollToBottom();
  $("new-messages").hidden = true;
  syncStreamingState();
}

async function jumpTo(messageId) {
  const data = await api.history(chat.id, { around: messageId, limit: chat.pageSize });
  resetWindow(data);
  const node = nodeFor(messageId);
  if (node) {
    node.scrollIntoView({ block: "center" });
    node.classList.add("highlight");
    node.focus({ preventScroll: true });
    setTimeout(() => node.classList.remove("highlight"), 2500);
  }
  $("new-messages").hidden = chat.win.atLiveEdge;
  syncStreamingState();
  // The jump may land near an edge: fill up around it.
  requestAnimationFrame(checkEdges);
}

async function loadPage(direction) {
  const older = direction === "older";
  const cursor = older ? chat.win.olderCursor : chat.win.newerCursor;
  if (chat.loading || !cursor || (!older && chat.win.atLiveEdge)) return;
  chat.loading = true;
  const generation = chat.generation;
  try {
    const params = older ? { before: cursor } : { after: cursor };
    const data = await api.history(chat.id, { ...params, limit: chat.pageSize });
    if (generation !== chat.generation) return; // the window was replaced meanwhile
    withAnchor(() => applyChange(older ? chat.win.prependOlder(data) : chat.win.appendNewer(data)));
    if (chat.win.atLiveEdge) $("new-messages").hidden = true;
  } catch {
    notice(t("load_error"));
  } finally {
    chat.loading = false;
  }
  requestAnimationFrame(checkEdges);
}

function checkEdges() {
  const box = scroller();
  if (!box) return;
  const margin = Math.max(600, box.clientHeight);
  // Whichever edge is closer first; the other follows when this load has landed.
  const toTop = box.scrollTop;
  const toBottom = box.scrollHeight - box.scrollTop - box.clientHeight;
  const wantOlder = toTop < margin && chat.win.olderCursor;
  const wantNewer = toBottom < margin && !chat.win.atLiveEdge;
  if (wantOlder && (!wantNewer || toTop <= toBottom)) loadPage("older");
  else if (wantNewer) loadPage("newer");
}

// --- Live events (WebSocket, or the REST stream when the socket is down) -------------------

function liveUpsert(message) {
  const stick = nearBottom();
  const change = chat.win.upsertLive(message);
  if (change.offEdge) {
    $("new-messages").hidden = false;
    return null;
  }
  withAnchor(() => applyChange(change));
  if (change.overflow) {
    // The live page alone passed the cap: reload the newest page (we are at the bottom).
    openNewest();
    return chat.win.find(message.id);
  }
  if (change.added.length) {
    if (stick || message.role === "user") scrollToBottom();
    else $("new-messages").hidden = false;
  }
  return chat.win.find(message.id);
}

function syncStreamingState() {
  const streaming = chat.win.messages.find((m) => m.status === "streaming" && m.role === "assistant");
  chat.streamingId = streaming ? streaming.id : null;
  const busy = Boolean(streaming) || Boolean(chat.sse);
  $("stop-btn").hidden = !busy;
  $("send-btn").disabled = busy;
}

async function fetchRendered(id) {
  // The final render comes from the server (sanitised Markdown); one message, `around` itself.
  try {
    const data = await api.history(chat.id, { around: id, limit: 1 });
    const fresh = data.messages.find((m) => m.id === id);
    const m = chat.win.find(id);
    if (fresh && m) {
      const stick = nearBottom(150);
      Object.assign(m, fresh);
      withAnchor(() => applyChange({ updated: [m] }));
      if (stick) scrollToBottom();
    }
  } catch {
    // The plain text stays; a reload shows the rendered form.
  }
}

function onEvent(event) {
  switch (event.type) {
    case "message": {
      const m = liveUpsert(event.message);
      if (m && m.role === "user") addTurn(m);
      break;
    }
    case "delta": {
      let m = chat.win.find(event.message_id);
      if (!m) {
        // The reply row is announced by its first delta.
        m = liveUpsert({
          id: event.message_id,
          session_id: chat.id,
          role: "assistant",
          content: "",
          status: "streaming",
          created_at: new Date().toISOString(),
          metadata: {},
        });
        if (!m) break;
      }
      if (m.status !== "streaming") {
        m.status = "streaming";
        m.content = "";
        delete m.content_html;
      }
      const stick = nearBottom(150);
      // `offset` places the piece in the reply: a piece seen twice (resume, two transports)
      // overwrites itself instead of doubling the text.
      if (Number.isInteger(event.offset) && event.offset <= m.content.length) {
        if (event.offset + event.text.length > m.content.length) {
          m.content = m.content.slice(0, event.offset) + event.text;
        }
      } else m.content += event.text;
      const node = nodeFor(m.id);
      if (node) {
        if (node.dataset.status !== "streaming") updateMessageNode(node, m);
        // Plain text while streaming: nothing the model sends is parsed as HTML here.
        else node.querySelector(".msg-body").textContent = m.content;
      }
      if (stick) scrollToBottom();
      syncStreamingState();
      break;
    }
    case "done": {
      const message = event.message;
      const m = liveUpsert(message);
      if (event.context_budget) setBudget(event.context_budget);
      if (m && message.role === "assistant" && typeof message.content_html !== "string") fetchRendered(m.id);
      syncStreamingState();
      break;
    }
    case "error":
      notice(`${t("error_prefix")} ${event.message || event.code}`, { level: "error" });
      break;
    case "compaction":
      if (event.state === "started") notice(t("compaction_started"), { sticky: true });
      else if (event.state === "failed") notice(t("compaction_failed"), { level: "error" });
      else if (event.state === "done") notice(t("compaction_done"));
      else clearNotice();
      break;
    case "tool_call":
    case "tool_result":
      if (event.message) liveUpsert(event.message);
      break;
    default:
      break;
  }
}

function setBudget(budget) {
  updateRing($("usage"), budget, (b) =>
    t("ring_title", {
      used: numberFormat.format(b.used_runes),
      limit: numberFormat.format(b.limit_runes),
      pct: b.used_pct,
    }),
  );
}

async function sendViaRest(path, body) {
  const controller = new AbortController();
  chat.sse = controller;
  syncStreamingState();
  try {
    await streamPost(path, body, onEvent, controller.signal);
  } catch (err) {
    if (err.name !== "AbortError") notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
    return false;
  } finally {
    chat.sse = null;
    syncStreamingState();
  }
  return true;
}

async function send(content) {
  const client_id = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
  if (!chat.win.atLiveEdge) await openNewest();
  if (chat.socket && chat.socket.send({ type: "send", content, client_id })) return true;
  return sendViaRest("/api/v1/chat/send", { session_id: chat.id, content, client_id });
}

async function regenerate(messageId) {
  const m = chat.win.find(messageId);
  if (m) {
    m.status = "streaming";
    m.content = "";
    delete m.content_html;
    applyChange({ updated: [m] });
    syncStreamingState();
  }
  if (chat.socket && chat.socket.open) {
    // The socket carries the events; the JSON request only starts the reply.
    try {
      await fetch("/api/v1/chat/regenerate", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
        body: JSON.stringify({ session_id: chat.id, message_id: messageId }),
      });
    } catch {
      notice(t("send_error"), { level: "error" });
    }
    return;
  }
  await sendViaRest("/api/v1/chat/regenerate", { session_id: chat.id, message_id: messageId });
}

function csrf() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

function stop() {
  if (chat.socket && chat.socket.send({ type: "cancel" })) return;
  // Without the socket: stop reading. The server finishes and stores the reply regardless.
  if (chat.sse) chat.sse.abort();
}

function setupComposer() {
  const form = $("composer");
  const input = $("composer-input");
  input.addEventListener("keydown", (e) => {
    // Enter sends, Shift+Enter is a new line; never while an IME is composing (Chinese input).
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const content = input.value;
    if (!content.trim() || $("send-btn").disabled) return;
    input.value = "";
    const ok = await send(content);
    if (ok === false && !input.value) input.value = content;
  });
  $("stop-btn").addEventListener("click", stop);
}

// --- Message actions ----------------------------------------------------------------------

async function editMessage(node, m) {
  const body = node.querySelector(".msg-body");
  const area = el("textarea", { class: "edit-input", "aria-label": t("edit"), rows: "4" });
  area.value = m.content;
  const save = el("button", { type: "submit", class: "btn primary small", text: t("edit_send") });
  const cancel = el("button", { type: "button", class: "btn small", text: t("cancel") });
  const form = el("form", { class: "edit-form" }, area, el("div", { class: "edit-actions" }, save, cancel));
  body.replaceChildren(form);
  node.querySelector(".msg-actions")?.setAttribute("hidden", "");
  area.focus();
  area.addEventListener("keydown", (e) => {
    if (e.key === "Escape") cancel.click();
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  cancel.addEventListener("click", () => updateMessageNode(node, m));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = area.value;
    if (!text.trim()) return;
    // Confirm only when the cut rewinds the rolling summary (older turns were compacted).
    try {
      const ctx = await api.context(chat.id);
      const anchor = ctx.verbatim_since_message_id;
      if (anchor !== null && m.id < anchor && !window.confirm(t("confirm_rewind"))) return;
      const result = await api.truncate(chat.id, m.id);
      if (result.context_budget) setBudget(result.context_budget);
    } catch (err) {
      notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
      return;
    }
    removeTurnsFrom(m.id);
    await openNewest();
    await send(text);
  });
}

async function onMessageAction(e) {
  const button = e.target.closest("button[data-action]");
  if (!button) return;
  const node = button.closest("[data-message-id]");
  const m = chat.win.find(Number(node.dataset.messageId));
  if (!m) return;
  switch (button.dataset.action) {
    case "copy":
      try {
        await navigator.clipboard.writeText(m.content);
        button.textContent = t("copied");
        setTimeout(() => (button.textContent = t("copy")), 1500);
      } catch {
        // Clipboard refused (permissions): nothing to do.
      }
      break;
    case "edit":
      editMessage(node, m);
      break;
    case "regenerate":
    case "retry":
      regenerate(m.id);
      break;
    case "remember":
      try {
        await api.remember(chat.agentId, m.content, m.id);
        button.textContent = t("remembered");
        button.disabled = true;
        if (!$("memory-panel").hidden) loadMemory();
      } catch (err) {
        notice(`${t("error_prefix")} ${err.message || ""}`, { level: "error" });
      }
      break;
    default:
      break;
  }
}

// --- Turn navigator -----------------------------------------------------------------------

const turns = { cursor: undefined, loaded: false, loading: false, done: false };

function turnItem(turn) {
  const button = el("button", { type: "button", class: "turn-link", "data-target-id": turn.message_id }, el("span", { text: turn.preview }));
  const when = new Date(turn.created_at);
  if (!Number.isNaN(when.getTime())) button.append(el("time", { datetime: turn.created_at, text: timeFormat.format(when) }));
  return el("li", { "data-turn-id": turn.message_id }, button);
}

async function loadTurns() {
  if (turns.loading || turns.done) return;
  turns.loading = true;
  try {
    const page = await api.turns(chat.id, turns.cursor);
    const listNode = $("turn-list");
    for (const turn of page.turns) listNode.append(turnItem(turn)); // newest first
    turns.cursor = page.next_cursor;
    turns.done = !page.next_cursor;
    turns.loaded = true;
    $("turns-status").textContent = listNode.children.length ? "" : t("no_turns");
  } finally {
    turns.loading = false;
  }
}

function addTurn(m) {
  if (!turns.loaded || document.querySelector(`[data-turn-id="${m.id}"]`)) return;
  const preview = m.content.replace(/\s+/g, " ").trim().slice(0, 120);
  $("turn-list").prepend(turnItem({ message_id: m.id, created_at: m.created_at, preview }));
  $("turns-status").textContent = "";
}

function removeTurnsFrom(id) {
  for (const li of $("turn-list").querySelectorAll("[data-turn-id]")) {
    if (Number(li.dataset.turnId) >= id) li.remove();
  }
}

function setupTurns() {
  $("toggle-turns").addEventListener("click", () => {
    if (togglePanel("turns-panel") && !turns.loaded) loadTurns();
  });
  $("close-turns").addEventListener("click", () => togglePanel("turns-panel", false));
  $("turns-panel").addEventListener("scroll", () => {
    const p = $("turns-panel");
    if (p.scrollHeight - p.scrollTop - p.clientHeight < 200) loadTurns();
  });
  $("turn-list").addEventListener("click", (e) => {
    const button = e.target.closest(".turn-link");
    if (!button) return;
    for (const b of $("turn-list").querySelectorAll(".turn-link[aria-current]")) b.removeAttribute("aria-current");
    button.setAttribute("aria-current", "true");
    jumpTo(Number(button.dataset.targetId));
    if (window.matchMedia("(max-width: 900px)").matches) togglePanel("turns-panel", false);
  });
}

// --- Agent memory panel -------------------------------------------------------------------

async function loadMemory() {
  const listNode = $("memory-list");
  try {
    const data = await api.memoryEntries(chat.agentId);
    const entries = Array.isArray(data) ? data : data.entries || data.results || [];
    listNode.replaceChildren(
      ...entries.map((entry) =>
        el("li", { class: "memory-entry" }, el("strong", { text: entry.name || entry.title || "" }), el("p", { text: entry.content || entry.preview || "" })),
      ),
    );
    if (!entries.length) listNode.replaceChildren(el("li", { class: "muted", text: t("memory_empty") }));
  } catch {
    listNode.replaceChildren(el("li", { class: "muted", text: t("load_error") }));
  }
}

function setupMemory() {
  if (!chat.agentId || !config.features.agents) return;
  $("toggle-memory").hidden = false;
  $("toggle-memory").addEventListener("click", () => {
    if (togglePanel("memory-panel")) loadMemory();
  });
  $("close-memory").addEventListener("click", () => togglePanel("memory-panel", false));
}

// --- Boot ---------------------------------------------------------------------------------

async function catchUp() {
  // After a reconnect: whatever happened meanwhile is in the database. Refresh the newest page
  // into the window if we are at the live edge (updates in place, appends what is new).
  if (!chat.win.atLiveEdge) return;
  try {
    const data = await api.history(chat.id, { limit: chat.pageSize });
    for (const m of data.messages) {
      const known = chat.win.find(m.id);
      if (known && known.status === "streaming" && m.status === "streaming" && known.content.length > m.content.length) continue;
      liveUpsert(m);
    }
    syncStreamingState();
  } catch {
    // Next reconnect tries again.
  }
}

async function setupChat() {
  setBudget(config.session.context_budget);
  $("messages").addEventListener("scroll", () => {
    checkEdges();
    if (chat.win.atLiveEdge && nearBottom()) $("new-messages").hidden = true;
  }, { passive: true });
  $("message-list").addEventListener("click", onMessageAction);
  $("new-messages").addEventListener("click", async () => {
    if (chat.win.atLiveEdge) scrollToBottom();
    else await openNewest();
    $("new-messages").hidden = true;
  });
  $("compact-now").addEventListener("click", async (e) => {
    const button = e.currentTarget;
    button.disabled = true;
    notice(t("compaction_started"), { sticky: true });
    try {
      const result = await api.compact(chat.id);
      setBudget(result.context_budget);
      notice(result.messages_rolled ? t("compaction_done") : t("compaction_noop"));
    } catch (err) {
      notice(err.code === "compaction_failed" ? t("compaction_failed") : `${t("error_prefix")} ${err.message}`, { level: "error" });
    } finally {
      button.disabled = false;
    }
  });
  setupComposer();
  setupTurns();
  setupMemory();
  await openNewest();
  firstPaint();
  chat.socket = new ChatSocket(chat.id, {
    onEvent,
    onOpen: ({ reconnected }) => {
      document.documentElement.dataset.socket = "open";
      clearNotice();
      if (reconnected) catchUp();
    },
    onDown: () => {
      document.documentElement.dataset.socket = "down";
    },
  });
  $("composer-input").focus();
}

setupNarrowLayout();
setupSidebar();
setupAgents();
if (chat.id) setupChat().catch(() => notice(t("load_error"), { level: "error" }));
else firstPaint();
