// The compaction history panel, read-only: the summary in force, as the model is sent it (its
// heading, then the text), and the session's snapshots, newest first, a page at a time.

import { api } from "./api.js";
import { $, el, t, timeElement } from "./dom.js";
import { togglePanel } from "./layout.js";

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

function showSummary(summary) {
  const parts = [el("h3", { text: t("summary_in_force") })];
  if (summary.text) {
    parts.push(el("pre", { class: "summary-sent", text: `${summary.heading}\n${summary.text}` }));
  } else parts.push(el("p", { class: "muted", text: t("summary_none") }));
  if (summary.verbatim_since_message_id != null) {
    parts.push(el("p", { class: "muted small", text: t("verbatim_since", { id: summary.verbatim_since_message_id }) }));
  }
  $("summary-now").replaceChildren(...parts);
}

export class HistoryPanel {
  #sessionId;
  #list = $("history-list");
  #older = $("history-older");
  #before = null;
  #loading = false;

  constructor({ sessionId }) {
    this.#sessionId = sessionId;
    $("toggle-history").addEventListener("click", () => {
      if (togglePanel("history-panel")) this.#load({ fresh: true });
    });
    $("close-history").addEventListener("click", () => togglePanel("history-panel", false));
    this.#older.addEventListener("click", () => this.#load());
  }

  // Something changed the summary (a compaction ended, an edit rewound it): an open panel
  // shows it at once.
  changed() {
    if (!$("history-panel").hidden) this.#load({ fresh: true });
  }

  async #load({ fresh = false } = {}) {
    if (this.#loading) return;
    this.#loading = true;
    try {
      const page = await api.snapshots(this.#sessionId, fresh ? null : this.#before);
      if (fresh) {
        this.#list.replaceChildren();
        showSummary(page.summary);
      }
      this.#list.append(...page.snapshots.map(historyEntry));
      this.#before = page.next_before;
      this.#older.hidden = !page.next_before;
      $("history-status").textContent = this.#list.children.length ? "" : t("history_empty");
    } catch {
      $("history-status").textContent = t("load_error");
    } finally {
      this.#loading = false;
    }
  }
}
