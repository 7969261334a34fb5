// The turn navigator: the user's questions, newest first, a page at a time, independent of the
// message window. Picking one opens the window around it.

import { api } from "./api.js";
import { $, el, t, timeElement } from "./dom.js";
import { isNarrow, togglePanel } from "./layout.js";

// plain.js loads with the panel's first page (most visits never open it).
let plainText = (text) => text;

// The preview as plain text (`**demo**` reads "demo"), at most a line or two.
function turnItem(turn) {
  const button = el("button", { type: "button", class: "turn-link", "data-target-id": turn.message_id },
    el("span", { text: plainText(turn.preview).slice(0, 160) }), timeElement(turn.created_at));
  return el("li", { "data-turn-id": turn.message_id }, button);
}

export class TurnNavigator {
  #sessionId;
  #onJump;
  #list = $("turn-list");
  #cursor = undefined;
  #loaded = false;
  #loading = false;
  #done = false;

  // `onJump(messageId)`: open the message window around a question.
  constructor({ sessionId, onJump }) {
    this.#sessionId = sessionId;
    this.#onJump = onJump;
    $("toggle-turns").addEventListener("click", () => {
      if (togglePanel("turns-panel") && !this.#loaded) this.#load();
    });
    $("close-turns").addEventListener("click", () => togglePanel("turns-panel", false));
    $("turns-panel").addEventListener("scroll", () => {
      const p = $("turns-panel");
      if (p.scrollHeight - p.scrollTop - p.clientHeight < 200) this.#load();
    });
    this.#list.addEventListener("click", (e) => this.#pick(e.target.closest(".turn-link")));
  }

  // A new question goes on top, once the list has been loaded (else the load brings it).
  add(m) {
    if (!this.#loaded || this.#list.querySelector(`[data-turn-id="${m.id}"]`)) return;
    const preview = m.content.slice(0, 400);
    this.#list.prepend(turnItem({ message_id: m.id, created_at: m.created_at, preview }));
    $("turns-status").textContent = "";
  }

  // Message `id` and everything after it were deleted (edit and resend).
  removeFrom(id) {
    for (const li of this.#list.querySelectorAll("[data-turn-id]")) {
      if (Number(li.dataset.turnId) >= id) li.remove();
    }
  }

  async #load() {
    if (this.#loading || this.#done) return;
    this.#loading = true;
    try {
      const [page, plain] = await Promise.all([api.turns(this.#sessionId, this.#cursor), import("./plain.js")]);
      plainText = plain.plainText;
      for (const turn of page.turns) this.#list.append(turnItem(turn)); // newest first
      this.#cursor = page.next_cursor;
      this.#done = !page.next_cursor;
      this.#loaded = true;
      $("turns-status").textContent = this.#list.children.length ? "" : t("no_turns");
    } catch {
      $("turns-status").textContent = t("load_error");
    } finally {
      this.#loading = false;
    }
  }

  #pick(button) {
    if (!button) return;
    for (const b of this.#list.querySelectorAll(".turn-link[aria-current]")) b.removeAttribute("aria-current");
    button.setAttribute("aria-current", "true");
    this.#onJump(Number(button.dataset.targetId));
    if (isNarrow()) togglePanel("turns-panel", false);
  }
}
