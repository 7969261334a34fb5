// The sessions sidebar: the paged list of chats (newest activity first), rename, delete (with
// a few seconds to undo it), "New chat" with its agent picker.

import { api } from "./api.js";
import { $, el, errorNotice, t } from "./dom.js";

// The dialogs load on first use: most visits never rename or delete anything.
const openDialog = async (options) => (await import("./dialog.js")).openDialog(options);

// The API deletes at once and for good, so the page waits this long before it asks: until
// then Undo only shows the chat again, and nothing was lost.
export const UNDO_MS = 6000;

function sessionItem(s, current) {
  const active = current !== null && s.id === current.id;
  const title = s.title || t("untitled");
  const link = el("a", { href: `/chat/${s.id}/`, class: "session-link", "aria-current": active ? "page" : null, text: title });
  const actions = el(
    "span",
    { class: "session-actions" },
    el("button", { type: "button", class: "icon-btn", "data-action": "rename", "aria-label": `${t("rename")}: ${title}`, title: t("rename"), text: "✎" }),
    el("button", { type: "button", class: "icon-btn", "data-action": "delete", "aria-label": `${t("delete")}: ${title}`, title: t("delete"), text: "✕" }),
  );
  return el("li", { class: active ? "session active" : "session", "data-session-id": s.id }, link, actions);
}

// A session's new name, wherever the page shows it: its sidebar entry (and that entry's button
// labels), and the header and tab when it is the open one. `title` is text, never markup.
export function sessionTitleShow(id, title) {
  const li = document.querySelector(`#session-list li[data-session-id="${Number(id)}"]`);
  if (li) {
    li.querySelector(".session-link").textContent = title;
    for (const button of li.querySelectorAll("button[data-action]")) {
      const action = button.dataset.action === "rename" ? t("rename") : t("delete");
      button.setAttribute("aria-label", `${action}: ${title}`);
    }
  }
  const open = $("chat").dataset.sessionId;
  if (open !== undefined && Number(open) === Number(id)) {
    $("chat-title").textContent = title;
    document.title = `${title} · Cadau`;
  }
}

// Sessions the user renamed on this page: a `title` event (an automatic name) that arrives
// after the user's own name must not show over it (the server never stored it over it).
const renamedHere = new Set();

export function sessionTitleAuto(id, title) {
  if (!renamedHere.has(Number(id))) sessionTitleShow(id, title);
}

export class SessionList {
  #current;
  #box = $("session-scroll");
  #list = $("session-list");
  #cursor = undefined;
  #loading = false;
  #done = false;
  #undo = new UndoBar();

  // `current`: the open session (page config), or null on the empty page.
  constructor({ current }) {
    this.#current = current;
    this.#box.addEventListener("scroll", () => {
      const box = this.#box;
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 300) this.#load();
    });
    this.#list.addEventListener("click", (e) => this.#act(e.target.closest("button[data-action]")));
    $("new-chat-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.#create();
    });
    this.#load();
  }

  async #load() {
    if (this.#loading || this.#done) return;
    this.#loading = true;
    try {
      const page = await api.sessions(this.#cursor);
      for (const s of page.results) this.#list.append(sessionItem(s, this.#current));
      this.#cursor = page.next_cursor;
      this.#done = !page.next_cursor;
      $("session-status").textContent = this.#list.children.length ? "" : t("no_sessions");
    } catch {
      $("session-status").textContent = t("load_error");
    } finally {
      this.#loading = false;
    }
    // Keep loading until the list overflows (a tall screen shows more than one page).
    if (!this.#done && this.#box.scrollHeight <= this.#box.clientHeight + 200) this.#load();
  }

  async #act(button) {
    if (!button) return;
    const li = button.closest("li[data-session-id]");
    const id = Number(li.dataset.sessionId);
    try {
      if (button.dataset.action === "rename") await this.#rename(id, li);
      else if (button.dataset.action === "delete") await this.#remove(id, li);
    } catch (err) {
      errorNotice(err);
    }
  }

  async #rename(id, li) {
    const link = li.querySelector(".session-link");
    const title = await openDialog({
      title: t("rename_title"),
      confirm: t("rename"),
      input: { label: t("rename_prompt"), value: link.textContent, maxLength: 200 },
    });
    if (!title) return;
    renamedHere.add(Number(id));
    const updated = await api.renameSession(id, title);
    sessionTitleShow(id, updated.title);
  }

  async #remove(id, li) {
    const title = li.querySelector(".session-link").textContent;
    const ok = await openDialog({
      title: t("delete_title", { title }),
      text: t("confirm_delete_undo"),
      confirm: t("delete"),
      danger: true,
    });
    if (!ok) return;
    const open = this.#current !== null && this.#current.id === id;
    this.#undo.start({
      text: t("chat_deleted", { title }),
      hide: () => {
        li.hidden = true;
        if (open) document.body.classList.add("chat-deleting");
      },
      restore: () => {
        li.hidden = false;
        document.body.classList.remove("chat-deleting");
        li.querySelector(".session-link").focus();
      },
      commit: async ({ keepalive }) => {
        try {
          await api.deleteSession(id, { keepalive });
        } catch (err) {
          if (err.status !== 404) throw err; // already gone elsewhere: done all the same
        }
        if (keepalive) return;
        if (open) window.location.assign("/");
        else li.remove();
      },
    });
  }

  async #create() {
    const agent = $("agent-select").value;
    try {
      const created = await api.createSession(agent ? { agent_id: Number(agent) } : {});
      window.location.assign(`/chat/${created.id}/`);
    } catch (err) {
      errorNotice(err);
    }
  }
}

// "Chat deleted · Undo" for UNDO_MS; the delete itself (`commit`) runs when the time is over,
// when another delete starts, or as the page goes away (a keepalive request that outlives it).
class UndoBar {
  #pending = null;
  #timer = null;

  constructor() {
    $("undo-btn").addEventListener("click", () => this.#cancel());
    window.addEventListener("pagehide", () => this.#flush({ keepalive: true }));
  }

  start({ text, hide, restore, commit }) {
    this.#flush({ keepalive: false });
    this.#pending = { restore, commit };
    hide();
    $("undo-text").textContent = text;
    $("undo-bar").hidden = false;
    this.#timer = setTimeout(() => this.#flush({ keepalive: false }), UNDO_MS);
    $("undo-btn").focus();
  }

  #close() {
    clearTimeout(this.#timer);
    const pending = this.#pending;
    this.#pending = null;
    $("undo-bar").hidden = true;
    return pending;
  }

  #cancel() {
    this.#close()?.restore();
  }

  #flush({ keepalive }) {
    const pending = this.#close();
    if (!pending) return;
    pending.commit({ keepalive }).catch((err) => {
      pending.restore();
      errorNotice(err);
    });
  }
}

// The picker appears only when the agents API exists and the user has agents.
export async function setupAgentPicker() {
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
