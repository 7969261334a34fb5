// The search results as DOM: one hit, its snippet, and what a failed search says. Snippets are
// the messages' own text, untrusted: they are built from text nodes and <mark> elements only,
// never parsed as HTML.

import { ApiError } from "./api.js";
import { el, t, timeElement } from "./dom.js";
import { roleLabel } from "./render.js";
import { snippetParts } from "./snippet.js";

// plain.js loads with the first search (most visits never search): search.js awaits this
// before it shows results.
let plainParts = null;
export async function hitsReady() {
  plainParts ??= (await import("./plain.js")).plainParts;
}

// As plain text: the Markdown marks of the message (`**demo**`) are left out.
export function markedSnippet(snippet, highlights) {
  const node = el("p", { class: "search-snippet" });
  const parts = snippetParts(snippet, highlights);
  for (const part of plainParts ? plainParts(parts) : parts) {
    node.append(part.marked ? el("mark", { text: part.text }) : part.text);
  }
  return node;
}

export function hitItem(hit) {
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

export function searchErrorText(err) {
  if (!(err instanceof ApiError)) return t("network_error");
  if (err.status === 429) {
    return err.retryAfter ? t("search_throttled_in", { seconds: err.retryAfter }) : t("search_throttled");
  }
  if (err.code === "search_timeout") return t("search_timeout");
  return `${t("error_prefix")} ${err.message}`;
}
