// The usage ring: context_budget.used_pct as an SVG arc, coloured against the session's
// compaction threshold (CHAT_CONTEXT_THRESHOLD_PCT, or the agent's config_json.context).

// At the default threshold the levels are the ones the ring always had: amber from 70, red
// from 88. Another threshold moves amber with it, so it comes a comparable way ahead of a
// compaction. (Multiplied first: 88 * 70 / 88 is exactly 70.)
const DEFAULT_THRESHOLD_PCT = 88;
const DEFAULT_WARN_PCT = 70;

export function ringLevel(pct, thresholdPct) {
  if (pct >= thresholdPct) return "danger";
  if (pct >= (thresholdPct * DEFAULT_WARN_PCT) / DEFAULT_THRESHOLD_PCT) return "warn";
  return "ok";
}

// `thresholdPct`: the session's threshold from the page; a budget that names its own
// (`threshold_pct`) is newer and wins.
export function updateRing(root, budget, { thresholdPct, format }) {
  if (!root || !budget) return;
  const pct = Math.max(0, Math.min(100, Number(budget.used_pct) || 0));
  const threshold = Number.isFinite(budget.threshold_pct) ? budget.threshold_pct : thresholdPct;
  const value = root.querySelector("#ring-value");
  const label = root.querySelector("#ring-pct");
  const tip = root.querySelector("#ring-tip");
  value.setAttribute("stroke-dasharray", `${pct.toFixed(1)} ${(100 - pct).toFixed(1)}`);
  // A zero-length arc with round caps would still draw a dot.
  value.setAttribute("visibility", pct < 0.5 ? "hidden" : "visible");
  root.dataset.level = ringLevel(pct, threshold);
  root.dataset.usedPct = String(budget.used_pct);
  root.dataset.thresholdPct = String(threshold);
  label.textContent = `${Math.round(pct)}%`;
  const text = format(budget);
  tip.textContent = text;
  // The name starts with what the button shows ("2%"), so speech input ("click 2 percent")
  // and a screen reader agree with the screen (axe: label-content-name-mismatch).
  root.querySelector("#ring-btn").setAttribute("aria-label", `${label.textContent} — ${text}`);
}
