// The usage ring: context_budget.used_pct as an SVG arc, coloured by threshold.

const WARN_PCT = 70;
const DANGER_PCT = 88; // the compaction threshold (CHAT_CONTEXT_THRESHOLD_PCT default)

export function ringLevel(pct) {
  if (pct >= DANGER_PCT) return "danger";
  if (pct >= WARN_PCT) return "warn";
  return "ok";
}

export function updateRing(root, budget, format) {
  if (!root || !budget) return;
  const pct = Math.max(0, Math.min(100, Number(budget.used_pct) || 0));
  const value = root.querySelector("#ring-value");
  const label = root.querySelector("#ring-pct");
  const tip = root.querySelector("#ring-tip");
  value.setAttribute("stroke-dasharray", `${pct.toFixed(1)} ${(100 - pct).toFixed(1)}`);
  // A zero-length arc with round caps would still draw a dot.
  value.setAttribute("visibility", pct < 0.5 ? "hidden" : "visible");
  root.dataset.level = ringLevel(pct);
  root.dataset.usedPct = String(budget.used_pct);
  label.textContent = `${Math.round(pct)}%`;
  const text = format(budget);
  tip.textContent = text;
  root.querySelector("#ring-btn").setAttribute("aria-label", text);
}
