// The agents page (/agents/, /agents/<id>/): the user's agents; one open at a time with its
// settings, its daily notes by day and its long-term memory (search, edit, delete). Everything
// goes through /api/v1/agents, which checks ownership; text is always set as text.

import { api } from "./api.js";
import { $, clearNotice, config, el, errorNotice, notice, t, timeElement } from "./dom.js";

function agentUrl(id) {
  return id ? `/agents/${id}/` : "/agents/";
}

function modelOptions(current) {
  const select = $("agent-model");
  const models = [...config.models];
  if (current && !models.includes(current)) models.push(current);
  select.replaceChildren(
    el("option", { value: "", text: t("default_model", { model: config.default_model }) }),
    ...models.map((m) => el("option", { value: m, text: m })),
  );
  select.value = current || "";
}

function toolBoxes(enabled) {
  $("agent-tools").replaceChildren(
    ...config.tools.map((tool) =>
      el(
        "label",
        { class: "check", title: tool.description },
        el("input", { type: "checkbox", name: "tools", value: tool.name, checked: enabled.includes(tool.name) }),
        ` ${tool.name}`,
      ),
    ),
  );
  if (!config.tools.length) $("agent-tools").textContent = t("no_tools");
}

function formValues() {
  return {
    name: $("agent-name").value.trim(),
    system_prompt: $("agent-prompt").value,
    model: $("agent-model").value,
    memory_auto_append: $("agent-auto-append").checked,
    memory_auto_extract: $("agent-auto-extract").checked,
    tools: [...document.querySelectorAll("#agent-tools input:checked")].map((box) => box.value),
  };
}

function entryItem(entry) {
  // The title is the entry's first line in its own words; the name is its file (an ASCII slug).
  const title = entry.title || entry.name;
  const text = el("textarea", { class: "entry-text", rows: 3, readonly: true, "aria-label": title });
  text.value = entry.content;
  const edit = el("button", { type: "button", class: "btn small", "data-action": "edit", text: t("edit") });
  const saveButton = el("button", { type: "button", class: "btn small primary", "data-action": "save", text: t("save"), hidden: true });
  const remove = el("button", { type: "button", class: "btn small danger", "data-action": "delete", text: t("delete") });
  const meta = el("div", { class: "entry-meta muted small" }, el("code", { text: entry.name }), " ", timeElement(entry.updated));
  if (entry.tags && entry.tags.length) meta.append(` · ${entry.tags.join(", ")}`);
  return el("li", { class: "entry", "data-entry-name": entry.name }, el("h3", { class: "entry-title", text: title }), meta, text, el("div", { class: "entry-actions" }, edit, saveButton, remove));
}

// The list of agents and the open one's settings form (a new agent's, or none).
class AgentEditor {
  #agent = null;
  #agents = [];
  // What the form showed when it opened, so a save sends only what the user changed (an admin
  // may have set a model or a limit this user may not set; a rename must not resend them).
  #shown = null;

  constructor() {
    $("agent-form").addEventListener("submit", (e) => this.#save(e));
    $("agent-delete").addEventListener("click", () => this.#remove());
    $("new-agent").addEventListener("click", () => {
      if (config.agent_id) {
        window.location.assign(agentUrl(null) + "#new");
        return;
      }
      clearNotice();
      this.show(null);
    });
    this.#loadList();
  }

  // `agent`: the one to edit, or null for a new one.
  show(agent) {
    this.#agent = agent;
    const cfg = (agent && agent.config_json) || {};
    $("agent-empty").hidden = true;
    $("agent-form").hidden = false;
    $("agent-form-title").textContent = agent ? agent.name : t("new_agent");
    $("agent-name").value = agent ? agent.name : "";
    $("agent-prompt").value = agent ? agent.system_prompt : "";
    modelOptions(agent ? agent.model : "");
    $("agent-auto-append").checked = cfg.memory_auto_append === true;
    $("agent-auto-extract").checked = cfg.memory_auto_extract !== false;
    toolBoxes(Array.isArray(cfg.tools) ? cfg.tools : config.tools.filter((tool) => tool.builtin).map((tool) => tool.name));
    $("agent-delete").hidden = !agent;
    this.#shown = formValues();
    $("agent-name").focus();
  }

  async #loadList() {
    const list = $("agents-list");
    try {
      const data = await api.agents();
      this.#agents = data.results || [];
    } catch (err) {
      $("agents-status").textContent = t("load_error");
      errorNotice(err);
      return;
    }
    list.replaceChildren(
      ...this.#agents.map((a) =>
        el(
          "li",
          { class: a.id === config.agent_id ? "agent-item active" : "agent-item", "data-agent-id": a.id },
          el("a", { href: agentUrl(a.id), "aria-current": a.id === config.agent_id ? "page" : null, text: a.name }),
        ),
      ),
    );
    $("agents-status").textContent = this.#agents.length ? "" : t("no_agents");
  }

  #formBody() {
    const now = formValues();
    const was = this.#shown;
    const agent = this.#agent;
    const body = {};
    for (const key of ["name", "system_prompt", "model"]) if (!agent || now[key] !== was[key]) body[key] = now[key];
    // config_json is replaced as a whole: start from what the agent has, change only what the
    // user changed (the tool list is written only when its boxes changed: an agent without one
    // keeps getting the built-in tools, new ones included).
    const previous = (agent && agent.config_json) || {};
    const changed = {};
    for (const key of ["memory_auto_append", "memory_auto_extract"]) if (!agent || now[key] !== was[key]) changed[key] = now[key];
    if (now.tools.join("\n") !== was.tools.join("\n")) changed.tools = now.tools;
    if (Object.keys(changed).length) body.config_json = { ...previous, ...changed };
    return body;
  }

  async #save(event) {
    event.preventDefault();
    const body = this.#formBody();
    if (!formValues().name) {
      notice(t("name_required"), { level: "error" });
      $("agent-name").focus();
      return;
    }
    try {
      if (this.#agent) {
        if (Object.keys(body).length) this.#agent = await api.updateAgent(this.#agent.id, body);
        this.#shown = formValues();
        $("agent-form-title").textContent = this.#agent.name;
        document.title = `${this.#agent.name} · ${t("my_agents")} · Cadau`;
        notice(t("agent_saved"));
        await this.#loadList();
      } else {
        const created = await api.createAgent(body);
        window.location.assign(agentUrl(created.id));
      }
    } catch (err) {
      errorNotice(err);
    }
  }

  async #remove() {
    const agent = this.#agent;
    if (!agent || !window.confirm(t("confirm_delete_agent", { name: agent.name }))) return;
    try {
      await api.deleteAgent(agent.id);
      window.location.assign(agentUrl(null));
    } catch (err) {
      errorNotice(err);
    }
  }
}

// The open agent's memory: its daily notes by day, and its long-term entries (search, edit,
// delete).
class AgentMemory {
  #agentId;

  constructor(agentId) {
    this.#agentId = agentId;
    $("daily-section").hidden = false;
    $("entries-section").hidden = false;
    $("daily-date").addEventListener("change", (e) => e.target.value && this.#showDay(e.target.value));
    $("daily-days").addEventListener("change", (e) => e.target.value && this.#showDay(e.target.value));
    $("entries-search").addEventListener("submit", (e) => {
      e.preventDefault();
      this.#loadEntries();
    });
    $("entries-list").addEventListener("click", (e) => this.#entryAction(e));
    this.#showDay(undefined);
    this.#loadEntries();
  }

  // `date`: YYYY-MM-DD, or undefined for today.
  async #showDay(date) {
    const note = $("daily-note");
    try {
      const data = await api.dailyNote(this.#agentId, date);
      $("daily-date").value = data.date;
      const days = $("daily-days");
      days.replaceChildren(
        el("option", { value: "", text: t("days_with_notes", { count: data.days.length }) }),
        ...data.days.map((day) => el("option", { value: day, text: day })),
      );
      days.value = data.days.includes(data.date) ? data.date : "";
      // Sanitised on the server (chat/rendering.py), as a reply is.
      if (data.markdown && typeof data.html === "string") note.innerHTML = data.html;
      else note.textContent = data.markdown || t("no_note");
      note.classList.toggle("muted", !data.markdown);
    } catch (err) {
      errorNotice(err);
    }
  }

  async #loadEntries() {
    const q = $("entries-q").value.trim();
    try {
      const data = await api.memoryEntries(this.#agentId, q);
      const entries = data.results || [];
      $("entries-list").replaceChildren(...entries.map(entryItem));
      $("entries-status").textContent = entries.length ? "" : q ? t("no_matches") : t("memory_empty");
    } catch (err) {
      errorNotice(err);
    }
  }

  async #entryAction(event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const item = button.closest("li[data-entry-name]");
    const name = item.dataset.entryName;
    const text = item.querySelector(".entry-text");
    try {
      if (button.dataset.action === "edit") {
        text.readOnly = false;
        text.focus();
        button.hidden = true;
        item.querySelector('[data-action="save"]').hidden = false;
      } else if (button.dataset.action === "save") {
        const updated = await api.updateEntry(this.#agentId, name, text.value);
        item.replaceWith(entryItem(updated));
        notice(t("entry_saved"));
      } else if (button.dataset.action === "delete") {
        if (!window.confirm(t("confirm_delete_entry"))) return;
        await api.deleteEntry(this.#agentId, name);
        item.remove();
        if (!$("entries-list").children.length) await this.#loadEntries();
      }
    } catch (err) {
      errorNotice(err);
    }
  }
}

async function start() {
  const editor = new AgentEditor();
  if (!config.agent_id) {
    if (window.location.hash === "#new") editor.show(null);
    return;
  }
  let agent;
  try {
    agent = await api.agent(config.agent_id);
  } catch (err) {
    errorNotice(err);
    return;
  }
  editor.show(agent);
  new AgentMemory(agent.id);
}

start();
