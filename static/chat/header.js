// The chat header's two pop-overs: the ring's panel (what the number means, what Compact now
// does, and the button) and, at phone width, the overflow menu that holds the panel toggles
// and Export. Each opens from its button (aria-expanded), and closes on Esc, on a click
// outside it, or from its button again.

import { $, numberFormat, t } from "./dom.js";

function popover(button, box, { onOpen = () => {} } = {}) {
  const set = (open) => {
    box.classList.toggle("open", open);
    if (box.id === "ring-panel") box.hidden = !open;
    button.setAttribute("aria-expanded", String(open));
    if (open) onOpen();
  };
  const isOpen = () => button.getAttribute("aria-expanded") === "true";
  button.addEventListener("click", () => set(!isOpen()));
  document.addEventListener("click", (e) => {
    if (isOpen() && !box.contains(e.target) && !button.contains(e.target)) set(false);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && isOpen() && !document.querySelector("dialog[open]")) {
      set(false);
      button.focus();
    }
  });
  return set;
}

export function setupHeader() {
  const ring = $("ring-btn");
  if (ring) popover(ring, $("ring-panel"));
  const more = $("more-btn");
  if (more) {
    const set = popover(more, $("head-tools"), {
      onOpen: () => $("head-tools").querySelector("button:not([hidden]), summary")?.focus(),
    });
    // A panel opened from the menu closes the menu (Export's own menu keeps it open).
    $("head-tools").addEventListener("click", (e) => {
      if (e.target.closest("button")) set(false);
    });
  }
}

// The ring panel's words for `budget` (the API's context_budget) against `thresholdPct`.
export function ringPanelTexts(budget, thresholdPct) {
  const pct = Number(budget.used_pct) || 0;
  const threshold = Number.isFinite(budget.threshold_pct) ? budget.threshold_pct : thresholdPct;
  const now = t("ring_now", {
    used: numberFormat.format(budget.used_runes),
    limit: numberFormat.format(budget.limit_runes),
    pct: Math.round(pct),
  });
  const auto = pct >= threshold ? t("ring_full", { threshold }) : t("ring_auto", { threshold });
  return { now, auto };
}

export function showRingPanel(budget, thresholdPct) {
  if (!budget || !$("ring-now")) return;
  const { now, auto } = ringPanelTexts(budget, thresholdPct);
  $("ring-now").textContent = now;
  $("ring-auto").textContent = auto;
}
