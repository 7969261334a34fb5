// The side panels (turn navigator, agent memory, compaction history) and, at phone width, the
// sidebar and panels sliding over the chat. Each panel owns its list and its paging state.

import { api } from "./api.js";
import { $, el, errorNotice, t, timeElement } from "./dom.js";

const PANELS = { "turns-panel": "toggle-turns", "memory-panel": "toggle-memory", "history-panel": "toggle-history" };

function togglePanel(id, force) {
  const panel = $(id);
  const show = force ?? panel.hidden;
  panel.hidden = !show;
  $(PANELS[id])?.setAttribute("aria-expanded", String(show));
  $("layout").classList.toggle("panel-open", Object.keys(PANELS).some((p) => $(p) && !$(p).hidden));
  return show;
}

// At phone width the sidebar slides over the chat (wider, these change nothing visible).
export function openSidebar() {
  $("layout").classList.add("sidebar-open");
  $("scrim").hidden = false;
}

export function closeSidebar() {
  $("layout").classList.remove("sidebar-open");
  $("scrim").hidden = true;
}

export function setupNarrowLayout() {
  $("open-sidebar")?.addEventListener("click", () => {
    openSidebar();
    $("new-chat").focus();
  });
  $("close-sidebar")?.addEventListener("click", closeSidebar);
  $("scrim").addEventListener("click", closeSidebar);
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    closeSidebar();
    for (const id of Object.keys(PANELS)) if ($(id) && !$(id).hidden) togglePanel(id, false);
  });
}

// --- Turn navigator: the user's questions, newest first, independent of the message window ---

function turnItem(turn) {
  const button = el("button", { type: "button", class: "turn-link", "data-target-id": turn.message_id },
    el("span", { text: turn.preview }), timeElement(turn.created_at));
  return el("li", { "data-turn-id": turn.message_id }, button);
}

// `onJump(messageId)`: open the message window around a question.
export function setupTurns({ sessionId, onJump }) {
  const state = { cursor: undefined, loaded: false, loading: false, done: false };
  const listNode = $("turn-list");

  async function load() {
    if (state.loading || state.done) return;
    state.loading = true;
    try {
      const page = await api.turns(sessionId, state.cursor);
      for (const turn of page.turns) listNode.append(turnItem(turn)); // newest first
      state.cursor = page.next_cursor;
      state.done = !page.next_cursor;
      state.loaded = true;
      $("turns-status").textContent = listNode.children.length ? "" : t("no_turns");
    } catch {
      $("turns-status").textContent = t("load_error");
    } finally {
      state.loading = false;
    }
  }

  $("toggle-turns").addEventListener("click", () => {
    if (togglePanel("turns-panel") && !state.loaded) load();
  });
  $("close-turns").addEventListener("click", () => togglePanel("turns-panel", false));
  $("turns-panel").addEventListener("scroll", () => {
    const p = $("turns-panel");
    if (p.scrollHeight - p.scrollTop - p.clientHeight < 200) load();
  });
  listNode.addEventListener("click", (e) => {
    const button = e.target.closest(".turn-link");
    if (!button) return;
    for (const b of listNode.querySelectorAll(".turn-link[aria-current]")) b.removeAttribute("aria-current");
    button.setAttribute("aria-current", "true");
    onJump(Number(button.dataset.targetId));
    if (window.matchMedia("(max-width: 900px)").matches) togglePanel("turns-panel", false);
  });

  return {
    // A new question goes on top, once the list has been loaded (else the load brings it).
    add(m) {
      if (!state.loaded || listNode.querySelector(`[data-turn-id="${m.id}"]`)) return;
      const preview = m.content.replace(/\s+/g, " ").trim().slice(0, 120);
      listNode.prepend(turnItem({ message_id: m.id, created_at: m.created_at, preview }));
      $("turns-status").textContent = "";
    },
    removeFrom(id) {
      for (const li of listNode.querySelectorAll("[data-turn-id]")) {
        if (Number(li.dataset.turnId) >= id) li.remove();
      }
    },
  };
}

// --- Agent memory: the long-term entries of the session's agent, and "Remember" ------------

export function setupMemory({ agentId }) {
  const listNode = $("memory-list");

  async function load() {
    try {
      const data = await api.memoryEntries(agentId);
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

  $("toggle-memory").hidden = false;
  $("toggle-memory").addEventListener("click", () => {
    if (togglePanel("memory-panel")) load();
  });
  $("close-memory").addEventListener("click", () => togglePanel("memory-panel", false));

  return {
    async remember(button, m) {
      try {
        await api.remember(agentId, m.content, m.id);
        button.textContent = t("remembered");
        button.disabled = true;
        if (!$("memory-panel").hidden) load();
      } catch (err) {
        errorNotice(err);
      }
    },
  };
}

// --- Compaction: what a compaction's end means, and the history panel ----------------------

// The notice for the end of a compaction (a `compaction` event, or "Compact now"'s answer):
// what actually happened. Only a committed one folded anything into the summary.
export function compactionNotice(outcome, messagesRolled) {
  switch (outcome) {
    case "committed":
      return { text: messagesRolled === 0 ? t("compaction_noop") : t("compaction_done"), level: "info" };
    case "skipped":
      return { text: t("compaction_skipped"), level: "info" };
    case "busy":
      return { text: t("compaction_busy"), level: "info" };
    case "conflict":
      return { text: t("compaction_conflict"), level: "info" };
    case "failed":
    case "rejected":
      return { text: t("compaction_failed"), level: "error" };
    default:
      return null;
  }
}

function historyEntry(snap) {
  const head = el("div", { class: "history-head" },
    el("strong", { text: t(`outcome_${snap.outcome}`) }), " ", timeElement(snap.created_at));
  const details = [];
  if (snap.covers_from_message_id != null && snap.covers_to_message_id != null) {
    details.push(t("history_range", { from: snap.covers_from_message_id, to: snap.covers_to_message_id }));
  }
  if (snap.messages_rolled) details.push(t("history_rolled", { n: snap.messages_rolled }));
  if (snap.trigger) details.push(snap.trigger);
  const item = el("li", { class: "history-entry", "data-snapshot-id": snap.id, "data-outcome": snap.outcome }, head,
    el("div", { class: "muted", text: details.join(" · ") }));
  if (snap.summary) item.append(el("details", {}, el("summary", { text: t("history_summary") }), el("pre", { text: snap.summary })));
  if (snap.error) item.append(el("p", { class: "muted", text: snap.error }));
  return item;
}

// Read-only: the summary in force, as the model is sent it (its heading, then the text), and
// the session's snapshots, newest first, a page at a time.
export function setupHistory({ sessionId }) {
  const listNode = $("history-list");
  const older = $("history-older");
  const state = { before: null, loading: false };

  function showSummary(summary) {
    const box = $("summary-now");
    const parts = [el("h3", { text: t("summary_in_force") })];
    if (summary.text) {
      parts.push(el("pre", { class: "summary-sent", text: `${summary.heading}\n${summary.text}` }));
    } else parts.push(el("p", { class: "muted", text: t("summary_none") }));
    if (summary.verbatim_since_message_id != null) {
      parts.push(el("p", { class: "muted small", text: t("verbatim_since", { id: summary.verbatim_since_message_id }) }));
    }
    box.replaceChildren(...parts);
  }

  async function load({ fresh = false } = {}) {
    if (state.loading) return;
    state.loading = true;
    try {
      const page = await api.snapshots(sessionId, fresh ? null : state.before);
      if (fresh) {
        listNode.replaceChildren();
        showSummary(page.summary);
      }
      listNode.append(...page.snapshots.map(historyEntry));
      state.before = page.next_before;
      older.hidden = !page.next_before;
      $("history-status").textContent = listNode.children.length ? "" : t("history_empty");
    } catch {
      $("history-status").textContent = t("load_error");
    } finally {
      state.loading = false;
    }
  }

  $("toggle-history").addEventListener("click", () => {
    if (togglePanel("history-panel")) load({ fresh: true });
  });
  $("close-history").addEventListener("click", () => togglePanel("history-panel", false));
  older.addEventListener("click", () => load());

  return {
    // Something changed the summary (a compaction ended, an edit rewound it): an open panel
    // shows it at once.
    changed() {
      if (!$("history-panel").hidden) load({ fresh: true });
    },
  };
}
