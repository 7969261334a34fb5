// Which panes show. At phone width the sidebar slides over the chat (wider, opening and closing
// it changes nothing visible); the side panels (turn navigator, agent memory, compaction
// history) open beside the chat. No state of its own: the DOM (`hidden`, the layout's classes)
// is the state.

import { $ } from "./dom.js";

const PANELS = { "turns-panel": "toggle-turns", "memory-panel": "toggle-memory", "history-panel": "toggle-history" };

// The width at which app.css lays the sidebar and the panels over the chat.
export const isNarrow = () => window.matchMedia("(max-width: 900px)").matches;

// `force`: show (true) or hide (false); without it, the other way round. Returns whether the
// panel now shows.
export function togglePanel(id, force) {
  const panel = $(id);
  const show = force ?? panel.hidden;
  panel.hidden = !show;
  $(PANELS[id])?.setAttribute("aria-expanded", String(show));
  $("layout").classList.toggle("panel-open", Object.keys(PANELS).some((p) => $(p) && !$(p).hidden));
  return show;
}

export function openSidebar() {
  $("layout").classList.add("sidebar-open");
  $("scrim").hidden = false;
}

export function closeSidebar() {
  $("layout").classList.remove("sidebar-open");
  $("scrim").hidden = true;
}

// The buttons that open and close the sidebar, and Esc, which closes it and every panel.
export function setupNarrowLayout() {
  $("open-sidebar")?.addEventListener("click", () => {
    openSidebar();
    $("new-chat").focus();
  });
  $("close-sidebar")?.addEventListener("click", closeSidebar);
  $("scrim").addEventListener("click", closeSidebar);
  document.addEventListener("keydown", (e) => {
    // A dialog's Esc is the dialog's (dialog.js).
    if (e.key !== "Escape" || document.querySelector("dialog[open]")) return;
    closeSidebar();
    for (const id of Object.keys(PANELS)) if ($(id) && !$(id).hidden) togglePanel(id, false);
  });
}
