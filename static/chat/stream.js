// Sending and the live reply: the composer, the session's WebSocket (or the REST event stream
// while the socket is down), the events both carry, and the actions that start or stop a
// reply: regenerate / retry, stop, edit and resend. It owns the transports; the messages it
// receives go into the MessageView.

import { api, streamPost } from "./api.js";
import { $, clearNotice, el, errorNotice, notice, t } from "./dom.js";
import { compactionNotice } from "./compaction.js";
import { sessionTitleAuto } from "./sessions.js";
import { ChatSocket } from "./socket.js";

export class Stream {
  #sessionId;
  #view;
  #setBudget;
  #onUserMessage;
  #onTruncate;
  #onCompacted;
  #socket = null;
  // The ids an edit deleted ([from, through]): a late event of a reply stopped for it (its
  // `done`, from another process) must not bring a deleted message back on screen.
  #gone = null;
  #rest = null; // AbortController of a REST stream in flight

  // `onUserMessage(m)`: a question of the user was stored (the turn navigator lists it);
  // `onTruncate(id)`: message `id` and everything after it were deleted (edit and resend);
  // `onCompacted()`: the summary may have changed (a compaction ended).
  constructor({ sessionId, view, setBudget, onUserMessage, onTruncate, onCompacted = () => {} }) {
    this.#sessionId = sessionId;
    this.#view = view;
    this.#setBudget = setBudget;
    this.#onUserMessage = onUserMessage;
    this.#onTruncate = onTruncate;
    this.#onCompacted = onCompacted;
  }

  connect() {
    this.#socket = new ChatSocket(this.#sessionId, {
      onEvent: (event) => this.#onEvent(event),
      onOpen: ({ reconnected }) => {
        document.documentElement.dataset.socket = "open";
        clearNotice();
        if (reconnected) this.#view.catchUp();
      },
      onDown: () => {
        document.documentElement.dataset.socket = "down";
      },
    });
  }

  // The connection comes back by itself (the test hook uses this to prove it).
  dropSocket() {
    this.#socket?.drop();
  }

  // Send waits and Stop shows while a reply streams in the window or a REST stream is open.
  syncBusy() {
    const busy = Boolean(this.#view.streamingReply()) || Boolean(this.#rest);
    $("stop-btn").hidden = !busy;
    $("send-btn").disabled = busy;
    // Editing deletes the streaming reply's rows: Stop it first (the server would stop it too).
    this.#view.setEditLocked(busy);
  }

  attachComposer() {
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
      const ok = await this.send(content);
      if (!ok && !input.value) input.value = content;
    });
    $("stop-btn").addEventListener("click", () => this.stop());
  }

  async send(content) {
    const client_id = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
    if (!this.#view.atLiveEdge) await this.#view.openNewest();
    if (this.#socket?.send({ type: "send", content, client_id })) return true;
    try {
      await this.#streamRest("/api/v1/chat/send", { session_id: this.#sessionId, content, client_id });
      return true;
    } catch (err) {
      if (err.name !== "AbortError") notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
      return false;
    }
  }

  async regenerate(messageId) {
    const m = this.#view.find(messageId);
    const shown = m && { status: m.status, content: m.content, content_html: m.content_html };
    if (m) {
      m.status = "streaming";
      m.content = "";
      delete m.content_html;
      this.#view.refresh(m);
    }
    const body = { session_id: this.#sessionId, message_id: messageId };
    try {
      // With the socket open, the socket carries the events; the request only starts the reply
      // (and answers when it is finished).
      if (this.#socket?.open) await api.regenerate(body);
      else await this.#streamRest("/api/v1/chat/regenerate", body);
    } catch (err) {
      if (err.name === "AbortError") return; // Stop without the socket: the reply goes on.
      // Refused (409 reply_in_progress, 400 not_last_reply) or never arrived: nothing was
      // restarted, so the reply shows what it showed before, unless a reply's events reached
      // it meanwhile (they are the truth then).
      if (m && m.status === "streaming" && !m.content) {
        m.status = shown.status;
        m.content = shown.content;
        if (typeof shown.content_html === "string") m.content_html = shown.content_html;
        this.#view.refresh(m);
      }
      errorNotice(err);
    }
  }

  stop() {
    if (this.#socket?.send({ type: "cancel" })) return;
    // Without the socket: stop reading. The server finishes and stores the reply regardless.
    this.#rest?.abort();
  }

  edit(node, m) {
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
    cancel.addEventListener("click", () => this.#view.refresh(m));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const text = area.value;
      if (!text.trim()) return;
      try {
        // Confirm only when the cut rewinds the rolling summary (older turns were compacted).
        const ctx = await api.context(this.#sessionId);
        const anchor = ctx.verbatim_since_message_id;
        if (anchor !== null && m.id < anchor && !window.confirm(t("confirm_rewind"))) return;
        const known = this.#view.messages.reduce((top, x) => Math.max(top, x.id), m.id);
        this.#gone = { from: m.id, through: known };
        const result = await api.truncate(this.#sessionId, m.id);
        this.#gone = { from: m.id, through: Math.max(known, result.cancelled_reply_id || 0) };
        if (result.context_budget) this.#setBudget(result.context_budget);
      } catch (err) {
        this.#gone = null; // nothing was deleted
        notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
        return;
      }
      this.#onTruncate(m.id);
      await this.#view.openNewest();
      await this.send(text);
    });
  }

  // POST with `Accept: text/event-stream`: the same events as the socket, for this one reply.
  async #streamRest(path, body) {
    const controller = new AbortController();
    this.#rest = controller;
    this.syncBusy();
    try {
      await streamPost(path, body, (event) => this.#onEvent(event), controller.signal);
    } finally {
      this.#rest = null;
      this.syncBusy();
    }
  }

  #onEvent(event) {
    const id = event.message ? event.message.id : event.message_id;
    if (this.#gone && Number.isInteger(id) && id >= this.#gone.from && id <= this.#gone.through) return;
    switch (event.type) {
      case "message": {
        const m = this.#view.liveUpsert(event.message);
        if (m && m.role === "user") this.#onUserMessage(m);
        break;
      }
      case "delta":
        this.#onDelta(event);
        break;
      case "done": {
        const message = event.message;
        const m = this.#view.liveUpsert(message);
        if (event.context_budget) this.#setBudget(event.context_budget);
        if (m && message.role === "assistant" && typeof message.content_html !== "string") this.#view.fetchRendered(m.id);
        break;
      }
      case "error":
        notice(`${t("error_prefix")} ${event.message || event.code}`, { level: "error" });
        break;
      case "compaction": {
        // The end of a compaction carries the budget afterwards: the ring moves now, not at
        // the next reply.
        if (event.context_budget) this.#setBudget(event.context_budget);
        if (event.state === "started") {
          notice(t("compaction_started"), { sticky: true });
          break;
        }
        // Say what happened: only a committed compaction folded turns into the summary.
        const outcome = event.outcome || { done: "committed", failed: "failed" }[event.state];
        const said = compactionNotice(outcome, event.messages_rolled);
        if (said) notice(said.text, { level: said.level });
        else clearNotice();
        this.#onCompacted();
        break;
      }
      case "title":
        // The session was named for the first time (chat/services/titles.py).
        if (typeof event.title === "string") sessionTitleAuto(event.session_id, event.title);
        break;
      case "tool_call":
      case "tool_result":
        if (event.message) this.#view.liveUpsert(event.message);
        break;
      default:
        break;
    }
  }

  #onDelta(event) {
    let m = this.#view.find(event.message_id);
    if (!m) {
      // The reply row is announced by its first delta.
      m = this.#view.liveUpsert({
        id: event.message_id,
        session_id: this.#sessionId,
        role: "assistant",
        content: "",
        status: "streaming",
        created_at: new Date().toISOString(),
        metadata: {},
      });
      if (!m) return;
    }
    if (m.status !== "streaming") {
      m.status = "streaming";
      m.content = "";
      delete m.content_html;
    }
    // A piece that starts past the text held means one was lost on the way: the stored row,
    // not a text with a hole, until the stream catches up (the server resends the text).
    if (Number.isInteger(event.offset) && event.offset > m.content.length) {
      if (!m.resyncing) {
        m.resyncing = true;
        this.#view.fetchRendered(m.id).finally(() => { m.resyncing = false; });
      }
      return;
    }
    // `offset` places the piece in the reply: a piece seen twice (resume, two transports)
    // overwrites itself instead of doubling the text.
    if (Number.isInteger(event.offset)) {
      if (event.offset + event.text.length > m.content.length) {
        m.content = m.content.slice(0, event.offset) + event.text;
      }
    } else m.content += event.text;
    this.#view.streamText(m);
    this.syncBusy();
  }
}
