// Sending and the live reply: the composer, the session's WebSocket (or the REST event stream
// while the socket is down), the events both carry, and the actions that start or stop a
// reply: regenerate / retry, stop, edit and resend (edit.js). It owns the transports and the
// reply's state as the page knows it; the messages it receives go into the MessageView.
//
// A reply's life as the events tell it: the user's `message`, then nothing until the model's
// first token (the page shows a pending bubble meanwhile), the reply row's `delta`s, and for an
// agent any number of tool rounds (`tool_call` on the row that asked, a `tool_result` per call,
// then the next row's deltas) until `done` with the last row. The server completes a round's
// row without an event of its own, so the page ends it when the next row starts
// (MessageView.settleRoundsBefore): without that the round's bubble said "Generating…" and Send
// stayed disabled after the answer.

import { api, streamPost } from "./api.js";
import { $, clearNotice, errorNotice, notice, t } from "./dom.js";
import { compactionNotice } from "./compaction.js";
import { sessionTitleAuto } from "./sessions.js";
import { ChatSocket } from "./socket.js";

// How long after a reply ended a "nothing to cancel" is the answer to a Stop that crossed it.
const CANCEL_GRACE_MS = 3000;
// A Stop pressed before the reply's first token is repeated this often until its `done`, a
// few times at most: between storing the turn and registering its reply the server has
// nothing to deliver a cancel to, and with a slow model no token comes to trigger another.
const CANCEL_REPEAT_MS = 600;
const CANCEL_REPEATS = 8;

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
  // A reply asked for whose row has not streamed yet: { clientId, userId, stopping }.
  #pending = null;
  // Stop was pressed for the running reply: every new row of it is cancelled too (a cancel
  // that reached the server before the reply was registered is lost; see #replyStarted).
  #stopWanted = false;
  #cancelled = new Set();
  #endedAt = 0;
  #cancelTimer = null;

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
        if (!reconnected) return;
        // What happened meanwhile is in the history, and a reply still running is announced
        // again (its partial `message`): a pending bubble would wait for events already gone.
        this.#pending = null;
        this.syncBusy();
        this.#view.catchUp();
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

  get busy() {
    return Boolean(this.#pending) || Boolean(this.#view.streamingReply()) || Boolean(this.#rest);
  }

  // Send waits and Stop shows while a reply is on its way, streams in the window or a REST
  // stream is open.
  syncBusy() {
    const busy = this.busy;
    $("stop-btn").hidden = !busy;
    $("send-btn").disabled = busy;
    $("composer").setAttribute("aria-busy", String(busy));
    this.#view.setPending(this.#pending && { stopping: this.#pending.stopping });
    // Editing deletes the streaming reply's rows: Stop it first (the server would stop it too).
    this.#view.setEditLocked(busy);
    if (!busy) this.#stopDone();
  }

  #stopDone() {
    this.#stopWanted = false;
    clearInterval(this.#cancelTimer);
    this.#cancelTimer = null;
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
    // The pending bubble shows at once, before the server has answered anything.
    this.#pending = { clientId: client_id, userId: null, stopping: false };
    this.syncBusy();
    if (!this.#view.atLiveEdge) await this.#view.openNewest();
    if (this.#socket?.send({ type: "send", content, client_id })) return true;
    try {
      await this.#streamRest("/api/v1/chat/send", { session_id: this.#sessionId, content, client_id });
      return true;
    } catch (err) {
      if (err.name !== "AbortError") notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
      return false;
    } finally {
      // The stream ended: whatever it did not deliver is not coming this way.
      if (this.#pending?.clientId === client_id) this.#pending = null;
      this.syncBusy();
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

  // Stop before the first token cancels the reply as well: the server stores the turn and
  // starts its reply at once, and a cancel that arrives before that is sent again when the
  // turn is stored and when the reply's row first streams.
  stop() {
    if (this.#socket?.open) {
      this.#stopWanted = true;
      if (this.#pending) this.#pending.stopping = true;
      // The row streaming now gets this cancel; its next deltas must not send another.
      const live = this.#view.streamingReply();
      if (live) this.#cancelled.add(live.id);
      this.syncBusy();
      this.#socket.send({ type: "cancel" });
      if (this.#pending && !this.#cancelTimer) {
        let left = CANCEL_REPEATS;
        this.#cancelTimer = setInterval(() => {
          left -= 1;
          if (left <= 0) this.#stopDone();
          else if (this.#stopWanted) this.#socket?.send({ type: "cancel" });
        }, CANCEL_REPEAT_MS);
      }
      return;
    }
    // Without the socket: stop reading. The server finishes and stores the reply regardless.
    this.#rest?.abort();
  }

  // Edit and resend, once the reader confirmed (edit.js): the cut, then the new text.
  async resend(m, text) {
    const known = this.#view.messages.reduce((top, x) => Math.max(top, x.id), m.id);
    try {
      this.#gone = { from: m.id, through: known };
      const result = await api.truncate(this.#sessionId, m.id);
      this.#gone = { from: m.id, through: Math.max(known, result.cancelled_reply_id || 0) };
      if (result.context_budget) this.#setBudget(result.context_budget);
    } catch (err) {
      this.#gone = null; // nothing was deleted
      notice(`${t("send_error")} ${err.message || ""}`, { level: "error" });
      return false;
    }
    this.#onTruncate(m.id);
    await this.#view.openNewest();
    await this.send(text);
    return true;
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
      case "message":
        this.#onMessage(event.message);
        break;
      case "delta":
        this.#replyStarted(event.message_id);
        this.#onDelta(event);
        break;
      case "done":
        this.#onDone(event);
        break;
      case "error":
        this.#onError(event);
        break;
      case "compaction":
        this.#onCompaction(event);
        break;
      case "title":
        // The session was named for the first time (chat/services/titles.py).
        if (typeof event.title === "string") sessionTitleAuto(event.session_id, event.title);
        break;
      case "tool_call":
        if (event.message) {
          this.#replyStarted(event.message.id);
          this.#view.liveUpsert(event.message);
        }
        break;
      case "tool_result":
        if (event.message) {
          if (typeof event.tool === "string") this.#view.noteTool(event.message.id, event.tool);
          if (event.tool === "memory_write" && !event.is_error) this.#view.noteMemory(event.message.id);
          this.#view.liveUpsert(event.message);
        }
        break;
      case "memory":
        this.#onMemory(event);
        break;
      default:
        break;
    }
    this.syncBusy();
  }

  #onMessage(message) {
    const m = this.#view.liveUpsert(message);
    if (message.role === "user") {
      if (m) this.#onUserMessage(m);
      // Ours (or another tab's): the turn is stored and its reply is starting.
      if (!this.#pending || this.#pending.clientId === message.client_id || this.#pending.userId === null) {
        const stopping = Boolean(this.#pending?.stopping);
        this.#pending = { clientId: message.client_id, userId: message.id, stopping };
        if (stopping) this.#socket?.send({ type: "cancel" });
      }
    } else if (message.role === "assistant" && message.status === "streaming") {
      this.#replyStarted(message.id);
    }
  }

  // Row `id` of the reply streams: the pending bubble gives way to it, the rounds before it
  // are over, and a Stop pressed before it reached the server stops it now.
  #replyStarted(id) {
    this.#pending = null;
    this.#view.settleRoundsBefore(id);
    if (this.#stopWanted && !this.#cancelled.has(id)) {
      this.#cancelled.add(id);
      this.#socket?.send({ type: "cancel" });
    }
  }

  #onDone(event) {
    const message = event.message;
    this.#pending = null;
    this.#stopDone();
    this.#endedAt = Date.now();
    // The reader watched it stream: it stays unfolded, however long.
    if (this.#view.find(message.id)?.status === "streaming") this.#view.keepUnfolded(message.id);
    const m = this.#view.liveUpsert(message);
    this.#view.settleRoundsBefore(message.id);
    if (event.context_budget) this.#setBudget(event.context_budget);
    if (m && message.role === "assistant" && typeof message.content_html !== "string") this.#view.fetchRendered(m.id);
  }

  #onError(event) {
    if (event.code === "nothing_to_cancel") {
      // A Stop that crossed the reply's end, or that came before the turn was stored (it is
      // sent again then): nothing to say.
      if (this.#pending?.stopping || Date.now() - this.#endedAt < CANCEL_GRACE_MS) return;
      notice(`${t("error_prefix")} ${event.message || event.code}`, { level: "error" });
      return;
    }
    // A refusal of our send before anything was stored: no reply is coming.
    if (this.#pending && this.#pending.userId === null && event.code !== "cancel_failed") this.#pending = null;
    notice(`${t("error_prefix")} ${event.message || event.code}`, { level: "error" });
  }

  #onMemory(event) {
    if (event.action === "remembered" && Number.isInteger(event.message_id)) this.#view.noteMemory(event.message_id);
    else if (event.action === "remember_failed") {
      notice(`${t("memory_failed")} ${event.error || ""}`, { level: "error" });
    }
  }

  #onCompaction(event) {
    // The end of a compaction carries the budget afterwards: the ring moves now, not at the
    // next reply.
    if (event.context_budget) this.#setBudget(event.context_budget);
    if (event.state === "started") {
      notice(t("compaction_started"), { sticky: true });
      return;
    }
    // Say what happened: only a committed compaction folded turns into the summary.
    const outcome = event.outcome || { done: "committed", failed: "failed" }[event.state];
    const said = compactionNotice(outcome, event.messages_rolled);
    if (said) notice(said.text, { level: said.level });
    else clearNotice();
    this.#onCompacted();
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
  }
}
