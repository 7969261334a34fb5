// Message search in the sidebar (GET /api/v1/chat/search): results as you type, "More
// results" along `next_cursor`, and the keyboard (`/` or Ctrl+K / Cmd+K to the box, arrows
// through the results, Enter opens one, Esc clears). Opening a hit is the page's business
// (`onOpen`). Snippets are the messages' own text, untrusted: they are built from text nodes and
// <mark> elements only, never parsed as HTML.

import { ApiError, api } from "./api.js";
import { $, el, t, timeElement } from "./dom.js";
import { roleLabel } from "./render.js";

const DEBOUNCE_MS = 250;
const PAGE_SIZE = 20;
// The query of a hit opened in another chat, so that chat's page shows the same results.
const CARRIED = "cadau.search";

// `highlights`: [start, end) in code points of `snippet` (the API's unit), merged and clamped
// here so a bad pair can neither throw nor repeat text.
export function markedSnippet(snippet, highlights) {
  const chars = Array.from(snippet);
  const ranges = [];
  for (const [a, b] of [...(highlights || [])].sort((x, y) => x[0] - y[0])) {
    const start = Math.max(0, a);
    const end = Math.min(chars.length, b);
    if (!(start < end)) continue;
    const last = ranges[ranges.length - 1];
    if (last && start <= last[1]) last[1] = Math.max(last[1], end);
    else ranges.push([start, end]);
  }
  const node = el("p", { class: "search-snippet" });
  let at = 0;
  for (const [start, end] of ranges) {
    if (start > at) node.append(chars.slice(at, start).join(""));
    node.append(el("mark", { text: chars.slice(start, end).join("") }));
    at = end;
  }
  if (at < chars.length) node.append(chars.slice(at).join(""));
  return node;
}

function hitItem(hit) {
  const head = el("div", { class: "search-hit-head" },
    el("span", { class: "search-hit-title", text: hit.session_title || t("untitled") }));
  const meta = el("div", { class: "search-hit-meta" },
    el("span", { class: "search-hit-role", text: roleLabel(hit.role) }), timeElement(hit.created_at));
  return el("li", {
    class: "search-hit",
    id: `search-hit-${hit.message_id}`,
    role: "option",
    "aria-selected": "false",
    "data-session-id": hit.session_id,
    "data-message-id": hit.message_id,
  }, head, meta, markedSnippet(hit.snippet, hit.highlights));
}

function errorText(err) {
  if (!(err instanceof ApiError)) return t("network_error");
  if (err.status === 429) {
    return err.retryAfter ? t("search_throttled_in", { seconds: err.retryAfter }) : t("search_throttled");
  }
  if (err.code === "search_timeout") return t("search_timeout");
  return `${t("error_prefix")} ${err.message}`;
}

// Focus is in something that takes typing: `/` is a character there, not a shortcut.
function typingIn(node) {
  return Boolean(node && (node.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(node.tagName)));
}

// `onOpen(hit)`: show that message (in this chat or another); `onFocus()`: the box is about to
// take focus from a shortcut (at phone width the sidebar must be open first).
export function setupSearch({ onOpen, onFocus = () => {} }) {
  const input = $("search-input");
  const box = $("search-results");
  const listNode = $("search-list");
  const status = $("search-status");
  const more = $("search-more");
  const sidebar = $("sidebar");
  // `generation` counts queries: a response is applied only to the query it was asked for, so a
  // late answer to an older query (or to "More" of one) never lands over a newer one.
  const state = { query: "", cursor: null, generation: 0, controller: null, timer: null, hits: new Map() };

  function setStatus(text, kind = "") {
    status.textContent = text;
    status.dataset.kind = kind;
  }

  function cancel() {
    clearTimeout(state.timer);
    state.timer = null;
    state.controller?.abort();
    state.controller = null;
    state.generation += 1;
  }

  function clear() {
    cancel();
    state.query = "";
    state.cursor = null;
    state.hits.clear();
    listNode.replaceChildren();
    setStatus("");
    more.hidden = true;
    box.hidden = true;
    sidebar.classList.remove("searching");
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
  }

  async function run({ next = false } = {}) {
    if (!next) {
      cancel();
      state.cursor = null;
      state.hits.clear();
      listNode.replaceChildren();
      more.hidden = true;
      input.removeAttribute("aria-activedescendant");
    } else if (state.controller) return; // "More" is already on its way
    const generation = state.generation;
    const controller = new AbortController();
    state.controller = controller;
    box.hidden = false;
    sidebar.classList.add("searching");
    input.setAttribute("aria-expanded", "true");
    listNode.setAttribute("aria-busy", "true");
    setStatus(t("search_searching"), "searching");
    more.disabled = true;
    try {
      const page = await api.search(
        { q: state.query, before: next ? state.cursor : undefined, limit: PAGE_SIZE },
        controller.signal,
      );
      if (generation !== state.generation) return;
      for (const hit of page.results) {
        if (state.hits.has(hit.message_id)) continue;
        state.hits.set(hit.message_id, hit);
        listNode.append(hitItem(hit));
      }
      state.cursor = page.next_cursor;
      // A short query scans a bounded stretch per request: an empty page may still go on.
      if (listNode.children.length) setStatus("");
      else setStatus(state.cursor ? t("search_none_yet") : t("search_none"), "empty");
    } catch (err) {
      if (generation !== state.generation || err.name === "AbortError") return;
      setStatus(errorText(err), "error");
    } finally {
      if (state.controller === controller) state.controller = null;
      if (generation === state.generation) {
        listNode.removeAttribute("aria-busy");
        more.hidden = !state.cursor;
        more.disabled = false;
      }
    }
  }

  // Every keystroke cancels what is in flight; the request goes out once typing pauses.
  function changed() {
    const query = input.value.trim();
    if (query === state.query) return;
    if (!query) {
      clear();
      return;
    }
    cancel();
    state.query = query;
    state.timer = setTimeout(() => {
      state.timer = null;
      run();
    }, DEBOUNCE_MS);
  }

  function options() {
    return [...listNode.children];
  }

  function activeIndex() {
    const id = input.getAttribute("aria-activedescendant");
    return id ? options().findIndex((n) => n.id === id) : -1;
  }

  function setActive(index) {
    const all = options();
    for (const n of all) n.setAttribute("aria-selected", "false");
    const node = all[index];
    if (!node) {
      input.removeAttribute("aria-activedescendant");
      return;
    }
    node.setAttribute("aria-selected", "true");
    input.setAttribute("aria-activedescendant", node.id);
    node.scrollIntoView({ block: "nearest" });
  }

  function open(node) {
    const hit = state.hits.get(Number(node.dataset.messageId));
    if (!hit) return;
    for (const n of listNode.querySelectorAll("[aria-current]")) n.removeAttribute("aria-current");
    node.setAttribute("aria-current", "true");
    setActive(options().indexOf(node));
    try {
      sessionStorage.setItem(CARRIED, state.query);
    } catch {
      // Storage refused: the other chat's page opens without the results.
    }
    onOpen(hit);
  }

  input.addEventListener("input", (e) => {
    if (!e.isComposing) changed(); // an IME's half-typed syllables are not a query yet
  });
  input.addEventListener("compositionend", changed);
  input.addEventListener("keydown", (e) => {
    if (e.isComposing || e.keyCode === 229) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const count = options().length;
      if (!count) return;
      e.preventDefault();
      const at = activeIndex();
      setActive(e.key === "ArrowDown" ? Math.min(at + 1, count - 1) : Math.max(at - 1, 0));
    } else if (e.key === "Enter") {
      e.preventDefault();
      if (state.timer) {
        // Enter before the pause: search now.
        clearTimeout(state.timer);
        state.timer = null;
        run();
        return;
      }
      // Nothing chosen with the arrows: the newest hit.
      const node = options()[Math.max(activeIndex(), 0)];
      if (node) open(node);
    } else if (e.key === "Escape") {
      e.preventDefault();
      if (input.value || !box.hidden) {
        e.stopPropagation(); // the first Esc clears; a second one closes the sidebar (phone)
        input.value = "";
        clear();
      }
      input.blur();
    }
  });
  listNode.addEventListener("click", (e) => {
    const node = e.target.closest(".search-hit");
    if (node) open(node);
  });
  more.addEventListener("click", () => {
    if (state.cursor) run({ next: true });
  });
  document.addEventListener("keydown", (e) => {
    const slash = e.key === "/" && !e.ctrlKey && !e.metaKey && !e.altKey && !typingIn(document.activeElement);
    const chord = (e.ctrlKey || e.metaKey) && !e.altKey && !e.shiftKey && e.key.toLowerCase() === "k";
    if (!slash && !chord) return;
    e.preventDefault();
    onFocus();
    input.focus();
    input.select();
  });

  // Arrived from a hit opened in another chat: the same results, that hit marked.
  let carried = null;
  try {
    carried = sessionStorage.getItem(CARRIED);
    sessionStorage.removeItem(CARRIED);
  } catch {
    carried = null;
  }
  const target = new URLSearchParams(window.location.search).get("m");
  if (carried && target) {
    input.value = carried;
    state.query = carried.trim();
    if (state.query) {
      run().then(() => {
        const node = document.getElementById(`search-hit-${Number(target)}`);
        node?.setAttribute("aria-current", "true");
      });
    }
  }
}
