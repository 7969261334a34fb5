// Message search in the sidebar (GET /api/v1/chat/search): results as you type, "More
// results" along `next_cursor`, and the keyboard (search-keys.js: `/` or Ctrl+K / Cmd+K to the
// box, arrows through the results, Enter opens one, Esc clears). Opening a hit is the page's
// business (`onOpen`); the results' DOM is search-hits.js's.

import { api } from "./api.js";
import { $, t } from "./dom.js";
import { searchCarried, searchCarry } from "./search-carry.js";
import { hitItem, hitsReady, searchErrorText } from "./search-hits.js";
import { HitListbox, isSearchShortcut } from "./search-keys.js";

const DEBOUNCE_MS = 250;
const PAGE_SIZE = 20;

export class Search {
  #onOpen;
  #onFocus;
  #input = $("search-input");
  #box = $("search-results");
  #list = $("search-list");
  #status = $("search-status");
  #more = $("search-more");
  #sidebar = $("sidebar");
  #listbox = new HitListbox(this.#input, this.#list);
  #query = "";
  #cursor = null;
  // Counts queries: a response is applied only to the query it was asked for, so a late answer
  // to an older query (or to "More" of one) never lands over a newer one.
  #generation = 0;
  #controller = null;
  #timer = null;
  #hits = new Map();

  // `onOpen(hit)`: show that message (in this chat or another); `onFocus()`: the box is about
  // to take focus from a shortcut (at phone width the sidebar must be open first).
  constructor({ onOpen, onFocus = () => {} }) {
    this.#onOpen = onOpen;
    this.#onFocus = onFocus;
    this.#listen();
    this.#resumeCarried();
  }

  #setStatus(text, kind = "") {
    this.#status.textContent = text;
    this.#status.dataset.kind = kind;
  }

  #cancel() {
    clearTimeout(this.#timer);
    this.#timer = null;
    this.#controller?.abort();
    this.#controller = null;
    this.#generation += 1;
  }

  #clear() {
    this.#cancel();
    this.#query = "";
    this.#cursor = null;
    this.#hits.clear();
    this.#list.replaceChildren();
    this.#setStatus("");
    this.#more.hidden = true;
    this.#box.hidden = true;
    this.#sidebar.classList.remove("searching");
    this.#input.setAttribute("aria-expanded", "false");
    this.#listbox.clearActive();
  }

  // A new query starts from an empty list; "More" adds to it.
  #begin(next) {
    if (!next) {
      this.#cancel();
      this.#cursor = null;
      this.#hits.clear();
      this.#list.replaceChildren();
      this.#more.hidden = true;
      this.#listbox.clearActive();
    }
    this.#box.hidden = false;
    this.#sidebar.classList.add("searching");
    this.#input.setAttribute("aria-expanded", "true");
    this.#list.setAttribute("aria-busy", "true");
    this.#setStatus(t("search_searching"), "searching");
    this.#more.disabled = true;
  }

  #show(page) {
    for (const hit of page.results) {
      if (this.#hits.has(hit.message_id)) continue;
      this.#hits.set(hit.message_id, hit);
      this.#list.append(hitItem(hit));
    }
    this.#cursor = page.next_cursor;
    // A short query scans a bounded stretch per request: an empty page may still go on.
    if (this.#list.children.length) this.#setStatus("");
    else this.#setStatus(this.#cursor ? t("search_none_yet") : t("search_none"), "empty");
  }

  async #run({ next = false } = {}) {
    if (next && this.#controller) return; // "More" is already on its way
    this.#begin(next);
    const generation = this.#generation;
    const controller = new AbortController();
    this.#controller = controller;
    try {
      const [page] = await Promise.all([
        api.search({ q: this.#query, before: next ? this.#cursor : undefined, limit: PAGE_SIZE }, controller.signal),
        hitsReady(),
      ]);
      if (generation === this.#generation) this.#show(page);
    } catch (err) {
      if (generation !== this.#generation || err.name === "AbortError") return;
      this.#setStatus(searchErrorText(err), "error");
    } finally {
      if (this.#controller === controller) this.#controller = null;
      if (generation === this.#generation) {
        this.#list.removeAttribute("aria-busy");
        this.#more.hidden = !this.#cursor;
        this.#more.disabled = false;
      }
    }
  }

  // Every keystroke cancels what is in flight; the request goes out once typing pauses.
  #changed() {
    const query = this.#input.value.trim();
    if (query === this.#query) return;
    if (!query) {
      this.#clear();
      return;
    }
    this.#cancel();
    this.#query = query;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#run();
    }, DEBOUNCE_MS);
  }

  #open(node) {
    const hit = this.#hits.get(Number(node.dataset.messageId));
    if (!hit) return;
    for (const n of this.#list.querySelectorAll("[aria-current]")) n.removeAttribute("aria-current");
    node.setAttribute("aria-current", "true");
    this.#listbox.setActive(this.#listbox.options.indexOf(node));
    searchCarry(this.#query);
    this.#onOpen(hit);
  }

  #onKey(e) {
    if (e.isComposing || e.keyCode === 229) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      if (this.#listbox.step(e.key)) e.preventDefault();
    } else if (e.key === "Enter") {
      e.preventDefault();
      if (this.#timer) {
        // Enter before the pause: search now.
        clearTimeout(this.#timer);
        this.#timer = null;
        this.#run();
        return;
      }
      const node = this.#listbox.chosen();
      if (node) this.#open(node);
    } else if (e.key === "Escape") {
      e.preventDefault();
      if (this.#input.value || !this.#box.hidden) {
        e.stopPropagation(); // the first Esc clears; a second one closes the sidebar (phone)
        this.#input.value = "";
        this.#clear();
      }
      this.#input.blur();
    }
  }

  #listen() {
    const input = this.#input;
    input.addEventListener("input", (e) => {
      if (!e.isComposing) this.#changed(); // an IME's half-typed syllables are not a query yet
    });
    input.addEventListener("compositionend", () => this.#changed());
    input.addEventListener("keydown", (e) => this.#onKey(e));
    this.#list.addEventListener("click", (e) => {
      const node = e.target.closest(".search-hit");
      if (node) this.#open(node);
    });
    this.#more.addEventListener("click", () => {
      if (this.#cursor) this.#run({ next: true });
    });
    document.addEventListener("keydown", (e) => {
      if (!isSearchShortcut(e)) return;
      e.preventDefault();
      this.#onFocus();
      input.focus();
      input.select();
    });
  }

  // Arrived from a hit opened in another chat: the same results, that hit marked.
  #resumeCarried() {
    const carried = searchCarried();
    const target = new URLSearchParams(window.location.search).get("m");
    if (!carried || !target) return;
    this.#input.value = carried;
    this.#query = carried.trim();
    if (!this.#query) return;
    this.#run().then(() => {
      const node = document.getElementById(`search-hit-${Number(target)}`);
      node?.setAttribute("aria-current", "true");
    });
  }
}
