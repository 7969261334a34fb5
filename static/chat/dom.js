// What every module of the page shares and none of them changes: the server's page config,
// translated strings, element helpers, and the notice banner (whose timer lives here only).
// The config is the JSON block #cadau-config: never executed, so the CSP can forbid inline
// scripts.

import { ApiError } from "./api.js";

export const config = Object.freeze(JSON.parse(document.getElementById("cadau-config").textContent));

export const $ = (id) => document.getElementById(id);

// "%(name)s" placeholders, as in the Python catalog the strings come from (chat/web/strings.py).
export function t(key, vars = {}) {
  const text = config.strings[key] ?? key;
  return text.replace(/%\((\w+)\)s/g, (_, name) => String(vars[name] ?? "")).replace(/%%/g, "%");
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

export const numberFormat = new Intl.NumberFormat(config.language);
const timeFormat = new Intl.DateTimeFormat(config.language, { dateStyle: "medium", timeStyle: "short" });

// null for a date that does not parse (el() skips it).
export function timeElement(iso) {
  const when = new Date(iso);
  return Number.isNaN(when.getTime()) ? null : el("time", { datetime: iso, text: timeFormat.format(when) });
}

let noticeTimer = null;
export function notice(text, { sticky = false, level = "info" } = {}) {
  const box = $("notice");
  if (!box) return;
  box.textContent = text;
  box.dataset.level = level;
  box.hidden = false;
  clearTimeout(noticeTimer);
  if (!sticky) noticeTimer = setTimeout(() => (box.hidden = true), 6000);
}

export function clearNotice() {
  const box = $("notice");
  if (box) box.hidden = true;
}

// A refusal from the server says why in its own words (`{"error": {"message"}}`); anything
// else means the request never got an answer.
export function errorNotice(err) {
  const text = err instanceof ApiError ? `${t("error_prefix")} ${err.message}` : t("network_error");
  notice(text, { level: "error" });
}
