// The bounded message window ("the WeChat pattern"), as pure data logic so it
// can be unit-tested without a DOM.
//
// The window is a run of consecutive history pages, each remembering the opaque cursors the
// API returned with it. Cursors cannot be made up on the client, so the window only ever drops
// *whole pages* from the far side: the page that becomes the new edge still carries the cursor
// to load beyond it again. After every load, pages are dropped from the side opposite to the
// one that grew until at most `cap` messages remain (a single page is never dropped).

export class MessageWindow {
  constructor({ cap = 150 } = {}) {
    this.cap = cap;
    this.pages = [];
  }

  get messages() {
    return this.pages.flatMap((p) => p.messages);
  }

  get count() {
    let n = 0;
    for (const p of this.pages) n += p.messages.length;
    return n;
  }

  // null: the oldest message of the session is in the window.
  get olderCursor() {
    return this.pages.length ? this.pages[0].olderCursor : null;
  }

  get newerCursor() {
    return this.pages.length ? this.pages[this.pages.length - 1].newerCursor : null;
  }

  get atLiveEdge() {
    return this.pages.length ? this.pages[this.pages.length - 1].atLiveEdge : true;
  }

  has(id) {
    return this.find(id) !== null;
  }

  find(id) {
    for (const p of this.pages) {
      const m = p.messages.find((x) => x.id === id);
      if (m) return m;
    }
    return null;
  }

  static page(data) {
    return {
      messages: data.messages.slice(),
      olderCursor: data.older_cursor,
      newerCursor: data.newer_cursor,
      atLiveEdge: Boolean(data.at_live_edge),
    };
  }

  // Replace everything (first load, jump to a turn, back to the newest).
  reset(data) {
    const removed = this.messages;
    this.pages = [MessageWindow.page(data)];
    return { added: this.pages[0].messages, removed };
  }

  // Messages already shown (a live message that also came with a page) are updated, not doubled.
  _split(messages) {
    const fresh = [];
    const updated = [];
    for (const m of messages) {
      const existing = this.find(m.id);
      if (existing) {
        Object.assign(existing, m);
        updated.push(existing);
      } else fresh.push(m);
    }
    return { fresh, updated };
  }

  prependOlder(data) {
    const page = MessageWindow.page(data);
    const { fresh, updated } = this._split(page.messages);
    page.messages = fresh;
    // An empty older page changes nothing but its cursor says "nothing further".
    if (!fresh.length) {
      if (this.pages.length) this.pages[0].olderCursor = page.olderCursor;
      return { added: [], updated, dropped: [] };
    }
    this.pages.unshift(page);
    const dropped = [];
    while (this.count > this.cap && this.pages.length > 1) {
      dropped.push(...this.pages.pop().messages);
      // Whatever lies beyond the new newest page exists: we just dropped it.
      this.pages[this.pages.length - 1].atLiveEdge = false;
    }
    return { added: fresh, updated, dropped };
  }

  appendNewer(data) {
    const page = MessageWindow.page(data);
    const { fresh, updated } = this._split(page.messages);
    page.messages = fresh;
    if (!fresh.length) {
      if (this.pages.length) {
        const last = this.pages[this.pages.length - 1];
        last.atLiveEdge = page.atLiveEdge;
        last.newerCursor = page.newerCursor;
      }
      return { added: [], updated, dropped: [] };
    }
    this.pages.push(page);
    const dropped = [];
    while (this.count > this.cap && this.pages.length > 1) {
      dropped.push(...this.pages.shift().messages);
    }
    return { added: fresh, updated, dropped };
  }

  // A message pushed by the server (WebSocket / SSE). Only the live edge shows it; elsewhere the
  // caller offers a "new messages" button instead. Returns {added|updated, dropped, overflow}.
  upsertLive(message) {
    const existing = this.find(message.id);
    if (existing) {
      Object.assign(existing, message);
      return { added: [], updated: [existing], dropped: [], overflow: false };
    }
    if (!this.atLiveEdge) return { added: [], updated: [], dropped: [], overflow: false, offEdge: true };
    if (!this.pages.length) {
      this.pages.push({ messages: [], olderCursor: null, newerCursor: null, atLiveEdge: true });
    }
    const last = this.pages[this.pages.length - 1];
    // Ids grow with time; keep the order even if two events cross.
    let at = last.messages.length;
    while (at > 0 && last.messages[at - 1].id > message.id) at -= 1;
    last.messages.splice(at, 0, message);
    const dropped = [];
    while (this.count > this.cap && this.pages.length > 1) {
      dropped.push(...this.pages.shift().messages);
    }
    // Live messages have no cursors of their own, so the live page cannot be split: when it
    // alone exceeds the cap, the caller reloads the newest page (at the bottom, nothing moves).
    return { added: [message], updated: [], dropped, overflow: this.count > this.cap };
  }

  // Edit-and-resend: the message and everything after it are gone from the server.
  truncateFrom(id) {
    const removed = [];
    for (const p of this.pages) {
      const keep = p.messages.filter((m) => m.id < id);
      removed.push(...p.messages.filter((m) => m.id >= id));
      p.messages = keep;
    }
    this.pages = this.pages.filter((p, i) => p.messages.length || i === 0);
    if (this.pages.length) this.pages[this.pages.length - 1].atLiveEdge = true;
    return removed;
  }
}
