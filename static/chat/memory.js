// The agent memory panel: the long-term entries of the session's agent, and "Remember" on a
// message, which saves it as one.

import { api } from "./api.js";
import { $, el, errorNotice, t } from "./dom.js";
import { togglePanel } from "./layout.js";

export class MemoryPanel {
  #agentId;
  #list = $("memory-list");

  constructor({ agentId }) {
    this.#agentId = agentId;
    $("toggle-memory").hidden = false;
    $("toggle-memory").addEventListener("click", () => {
      if (togglePanel("memory-panel")) this.#load();
    });
    $("close-memory").addEventListener("click", () => togglePanel("memory-panel", false));
  }

  async remember(button, m) {
    try {
      await api.remember(this.#agentId, m.content, m.id);
      button.textContent = t("remembered");
      button.disabled = true;
      if (!$("memory-panel").hidden) this.#load();
    } catch (err) {
      errorNotice(err);
    }
  }

  async #load() {
    const list = this.#list;
    try {
      const data = await api.memoryEntries(this.#agentId);
      const entries = Array.isArray(data) ? data : data.entries || data.results || [];
      list.replaceChildren(
        ...entries.map((entry) =>
          el("li", { class: "memory-entry" }, el("strong", { text: entry.title || entry.name || "" }), el("p", { text: entry.content || entry.preview || "" })),
        ),
      );
      if (!entries.length) list.replaceChildren(el("li", { class: "muted", text: t("memory_empty") }));
    } catch {
      list.replaceChildren(el("li", { class: "muted", text: t("load_error") }));
    }
  }
}
