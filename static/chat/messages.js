// The bounded message window on screen: MessageWindow (window.js) decides which pages are held,
// this view mirrors it into #message-list, loads pages as the reader scrolls, keeps what is on
// screen still while pages come and go above it, and places live messages. It owns the window;
// other modules go through its methods.

import { api } from "./api.js";
import { $, el, notice, t } from "./dom.js";
import { latestButton } from "./latest.js";
import { isLong, roundsOver, toolNameFor } from "./message-parts.js";
import { renderMessage, updateMessageNode, updateStreamingText } from "./render.js";
import { MessageWindow } from "./window.js";

const scroller = () => $("messages");
const list = () => $("message-list");
const nodeFor = (id) => document.getElementById(`m-${id}`);

export class MessageView {
  #win;
  #sessionId;
  #pageSize;
  #canRemember;
  #onChange;
  // One page load at a time, and none applied across a reset (jump, back to newest): a page is
  // only ever joined to the window it was requested for, so the window stays contiguous.
  #loading = false;
  #generation = 0;
  #lastAssistantShown = null;
  #editLocked = false;
  // What the page learnt from events and the reader, by message id: the tool a `tool` message
  // answers (`tool_result` names it), the turns that wrote the agent's memory, the long
  // messages the reader unfolded (or watched stream in).
  #toolNames = new Map();
  #memory = new Set();
  #expanded = new Set();
  // A message arrived that the reader has not seen (scrolled up, or away from the live edge).
  #unseen = false;

  // `onChange` runs after every change of the window (the composer follows whether a reply is
  // streaming in it).
  constructor({ sessionId, cap, pageSize, canRemember, onChange }) {
    this.#win = new MessageWindow({ cap });
    this.#sessionId = sessionId;
    this.#pageSize = pageSize;
    this.#canRemember = canRemember;
    this.#onChange = onChange;
  }

  // Read-only questions about the window.
  get cap() {
    return this.#win.cap;
  }
  get count() {
    return this.#win.count;
  }
  get messages() {
    return this.#win.messages;
  }
  get olderCursor() {
    return this.#win.olderCursor;
  }
  get atLiveEdge() {
    return this.#win.atLiveEdge;
  }
  find(id) {
    return this.#win.find(id);
  }
  streamingReply() {
    return this.#win.messages.find((m) => m.status === "streaming" && m.role === "assistant") || null;
  }

  // While a reply streams, Edit (which deletes it) waits: the buttons are disabled, on the
  // nodes shown now and on those rendered until it ends.
  setEditLocked(locked) {
    if (locked === this.#editLocked) return;
    this.#editLocked = locked;
    this.#lockEdits();
  }

  #lockEdits() {
    for (const button of list().querySelectorAll('button[data-action="edit"]')) button.disabled = this.#editLocked;
  }

  attach() {
    scroller().addEventListener("scroll", () => {
      this.#checkEdges();
      this.#syncLatest();
    }, { passive: true });
    $("new-messages").addEventListener("click", async () => {
      if (this.#win.atLiveEdge) this.#scrollToBottom();
      else await this.openNewest();
      this.#unseen = false;
      this.#syncLatest();
      $("composer-input").focus();
    });
  }

  async openNewest() {
    const data = await api.history(this.#sessionId, { limit: this.#pageSize });
    this.#reset(data);
    this.#scrollToBottom();
    this.#unseen = false;
    this.#syncLatest();
  }

  // "Jump to latest" or "New messages ↓" (latest.js), or neither.
  #syncLatest() {
    const box = scroller();
    const nearBottom = this.#nearBottom();
    if (nearBottom && this.#win.atLiveEdge) this.#unseen = false;
    const kind = latestButton({
      atLiveEdge: this.#win.atLiveEdge,
      nearBottom,
      far: box.scrollHeight - box.scrollTop - box.clientHeight > box.clientHeight,
      unseen: this.#unseen,
    });
    const button = $("new-messages");
    button.hidden = kind === null;
    if (kind && button.dataset.kind !== kind) {
      button.dataset.kind = kind;
      button.textContent = kind === "new" ? t("new_messages") : t("jump_latest");
    }
  }

  // The reply on its way before its first token (or its row): a bubble of its own below the
  // list, outside the window, with a typing indicator. `state`: null (none), or
  // { stopping } while a Stop waits for the server.
  setPending(state) {
    const slot = $("pending-slot");
    if (!slot) return;
    if (!state) {
      slot.replaceChildren();
      return;
    }
    const text = state.stopping ? t("stopping") : t("pending_reply");
    const current = slot.firstElementChild;
    if (current && current.dataset.text === text) return;
    const stick = this.#nearBottom(150);
    const dots = el("span", { class: "typing", "aria-hidden": "true" }, el("span"), el("span"), el("span"));
    slot.replaceChildren(el("article", {
      class: "msg msg-assistant pending",
      id: "pending-reply",
      "aria-busy": "true",
      "data-text": text,
    }, el("header", { class: "msg-head" }, el("span", { class: "msg-role", text: t("assistant") })),
    el("div", { class: "msg-body" }, dots, el("span", { class: "visually-hidden", role: "status", text }))));
    if (stick) this.#scrollToBottom();
  }

  // A `tool_result` named the tool of message `id`; a memory write was reported for it.
  noteTool(id, name) {
    this.#toolNames.set(id, name);
  }

  noteMemory(id) {
    this.#memory.add(id);
    const m = this.#win.find(id);
    if (m) this.refresh(m);
  }

  // The reader watched message `id` arrive: it stays unfolded however long it ends.
  keepUnfolded(id) {
    this.#expanded.add(id);
  }

  // "Show more" / "Show less" on a long message.
  toggleFold(m) {
    if (this.#expanded.has(m.id)) this.#expanded.delete(m.id);
    else this.#expanded.add(m.id);
    this.refresh(m);
    nodeFor(m.id)?.querySelector(".fold-btn")?.focus();
  }

  // Rounds of the reply that ended before row `id` (message-parts.js roundsOver): a tool
  // round's row is complete (the server completed it before opening the next one); any other
  // is read again from the server. Returns whether one changed.
  settleRoundsBefore(id) {
    const over = roundsOver(this.#win.messages, id);
    for (const m of over) {
      if (m.tool_calls && m.tool_calls.length) {
        m.status = "complete";
        this.refresh(m);
        if (m.content) this.fetchRendered(m.id);
      } else this.fetchRendered(m.id);
    }
    return over.length > 0;
  }

  async jumpTo(messageId) {
    const data = await api.history(this.#sessionId, { around: messageId, limit: this.#pageSize });
    this.#reset(data);
    const node = nodeFor(messageId);
    if (node) {
      node.scrollIntoView({ block: "center" });
      node.classList.add("highlight");
      node.focus({ preventScroll: true });
      setTimeout(() => node.classList.remove("highlight"), 2500);
    }
    // Nothing new arrived: the way back is "Jump to latest", not "New messages".
    this.#unseen = false;
    this.#syncLatest();
    // The jump may land near an edge: fill up around it.
    requestAnimationFrame(() => this.#checkEdges());
  }

  // A message pushed by the server (WebSocket / SSE). Returns the window's copy, or null when
  // the window is away from the live edge (then the "new messages" button shows instead).
  liveUpsert(message) {
    const stick = this.#nearBottom();
    const change = this.#win.upsertLive(message);
    if (change.offEdge) {
      this.#unseen = true;
      this.#syncLatest();
      return null;
    }
    this.#withAnchor(() => this.#apply(change));
    if (change.overflow) {
      // The live page alone passed the cap: reload the newest page (we are at the bottom).
      this.openNewest();
    } else if (change.added.length) {
      if (stick || message.role === "user") this.#scrollToBottom();
      else this.#unseen = true;
      this.#syncLatest();
    }
    return this.#win.find(message.id);
  }

  // Re-render a message of the window after its fields changed.
  refresh(m) {
    this.#withAnchor(() => this.#apply({ updated: [m] }));
  }

  // The text of a streaming reply grew: follow it if the reader is at the bottom.
  streamText(m) {
    const stick = this.#nearBottom(150);
    const node = nodeFor(m.id);
    if (node && node.dataset.status !== "streaming") this.#update(node, m);
    else if (node) updateStreamingText(node, m);
    if (stick) this.#scrollToBottom();
  }

  // The final render comes from the server (sanitised Markdown); one message, `around` itself.
  async fetchRendered(id) {
    try {
      const data = await api.history(this.#sessionId, { around: id, limit: 1 });
      const fresh = data.messages.find((m) => m.id === id);
      const m = this.#win.find(id);
      if (fresh && m) {
        const stick = this.#nearBottom(150);
        Object.assign(m, fresh);
        this.refresh(m);
        if (stick) this.#scrollToBottom();
      }
    } catch {
      // The plain text stays; a reload shows the rendered form.
    }
  }

  // After a reconnect: whatever happened meanwhile is in the database. Refresh the newest page
  // into the window if it is at the live edge (updates in place, appends what is new).
  async catchUp() {
    if (!this.#win.atLiveEdge) return;
    try {
      const data = await api.history(this.#sessionId, { limit: this.#pageSize });
      for (const m of data.messages) {
        const known = this.#win.find(m.id);
        // The socket may already have streamed further than the row's last saved progress.
        if (known && known.status === "streaming" && m.status === "streaming" && known.content.length > m.content.length) continue;
        this.liveUpsert(m);
      }
    } catch {
      // Next reconnect tries again.
    }
  }

  #isLastAssistant(m) {
    const all = this.#win.messages;
    return this.#win.atLiveEdge && all.length > 0 && all[all.length - 1].id === m.id && m.role === "assistant";
  }

  // What one message's DOM depends on besides the message (render.js updateMessageNode).
  #options(m) {
    const toolName = m.role === "tool" ? toolNameFor(m, this.#win.messages, this.#toolNames.get(m.id)) : null;
    const wroteMemory = toolName === "memory_write" && !m.content.startsWith("Error");
    return {
      isLast: this.#isLastAssistant(m),
      canRemember: this.#canRemember,
      toolName,
      memory: this.#memory.has(m.id) || wroteMemory,
      folded: isLong(m) ? !this.#expanded.has(m.id) : null,
    };
  }

  #update(node, m) {
    updateMessageNode(node, m, this.#options(m));
  }

  // Apply a window change to the DOM: drop, add in id order, refresh updated ones.
  #apply({ added = [], updated = [], dropped = [], removed = [] }) {
    for (const m of [...dropped, ...removed]) nodeFor(m.id)?.remove();
    const container = list();
    for (const m of added) {
      const node = renderMessage(m, this.#options(m));
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
      if (node) this.#update(node, m);
    }
    this.#refreshLastActions();
    if (this.#editLocked && (added.length || updated.length)) this.#lockEdits();
    scroller().classList.toggle("is-empty", !container.children.length);
    this.#onChange();
  }

  // Regenerate / retry belong to the newest reply only: when it changes, re-render the
  // previous and the new one.
  #refreshLastActions() {
    const all = this.#win.messages;
    const last = all.length ? all[all.length - 1] : null;
    const current = last && last.role === "assistant" ? last.id : null;
    if (current === this.#lastAssistantShown) return;
    for (const id of [this.#lastAssistantShown, current]) {
      const m = id && this.#win.find(id);
      const node = id && nodeFor(id);
      if (m && node) this.#update(node, m);
    }
    this.#lastAssistantShown = current;
  }

  #reset(data) {
    this.#generation += 1;
    this.#win.reset(data);
    // Rebuild the list outright: nothing of the previous window may linger in the DOM.
    list().replaceChildren();
    this.#lastAssistantShown = null;
    this.#apply({ added: this.#win.messages });
  }

  async #loadPage(direction) {
    const older = direction === "older";
    const cursor = older ? this.#win.olderCursor : this.#win.newerCursor;
    if (this.#loading || !cursor || (!older && this.#win.atLiveEdge)) return;
    this.#loading = true;
    const generation = this.#generation;
    try {
      const params = older ? { before: cursor } : { after: cursor };
      const data = await api.history(this.#sessionId, { ...params, limit: this.#pageSize });
      if (generation !== this.#generation) return; // the window was replaced meanwhile
      this.#withAnchor(() => this.#apply(older ? this.#win.prependOlder(data) : this.#win.appendNewer(data)));
      this.#syncLatest();
    } catch {
      notice(t("load_error"));
    } finally {
      this.#loading = false;
    }
    requestAnimationFrame(() => this.#checkEdges());
  }

  #checkEdges() {
    const box = scroller();
    if (!box) return;
    const margin = Math.max(600, box.clientHeight);
    // Whichever edge is closer first; the other follows when this load has landed.
    const toTop = box.scrollTop;
    const toBottom = box.scrollHeight - box.scrollTop - box.clientHeight;
    const wantOlder = toTop < margin && this.#win.olderCursor;
    const wantNewer = toBottom < margin && !this.#win.atLiveEdge;
    if (wantOlder && (!wantNewer || toTop <= toBottom)) this.#loadPage("older");
    else if (wantNewer) this.#loadPage("newer");
  }

  #nearBottom(px = 80) {
    const box = scroller();
    return box.scrollHeight - box.scrollTop - box.clientHeight < px;
  }

  #scrollToBottom() {
    const box = scroller();
    box.scrollTop = box.scrollHeight;
  }

  // Keep the first visible message where it is on screen across any DOM change above or below.
  #withAnchor(mutate) {
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
}
