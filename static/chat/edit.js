// Edit and resend: the message's text in place, then a dialog that says what goes (the message,
// the N later ones, and the summary's newer part when the cut falls inside it) before the cut
// (Stream.resend) and the new send.

import { api } from "./api.js";
import { el, errorNotice, t } from "./dom.js";
import { openDialog } from "./dialog.js";

// Pages of 200 read forward at most, to count what an edit far up a long chat deletes.
const COUNT_PAGES = 10;

// How many messages come after `m` in the session: { n, atLeast } (atLeast: there are more
// than counted). The window knows when it holds the newest page; otherwise the history is read
// forward from `m`.
export async function laterCount({ sessionId, view, m }) {
  if (view.atLiveEdge) return { n: view.messages.filter((x) => x.id > m.id).length, atLeast: false };
  let data = await api.history(sessionId, { around: m.id, limit: 200 });
  let n = data.messages.filter((x) => x.id > m.id).length;
  for (let page = 0; !data.at_live_edge && page < COUNT_PAGES; page += 1) {
    data = await api.history(sessionId, { after: data.newer_cursor, limit: 200 });
    n += data.messages.length;
  }
  return { n, atLeast: !data.at_live_edge };
}

export function editWarning({ n, atLeast }, rewinds) {
  let text;
  if (atLeast) text = t("edit_deletes_at_least", { n });
  else if (n === 0) text = t("edit_deletes_none");
  else if (n === 1) text = t("edit_deletes_one");
  else text = t("edit_deletes_many", { n });
  return rewinds ? `${text} ${t("edit_rewinds")}` : text;
}

async function confirmEdit({ sessionId, view, m }) {
  const [count, ctx] = await Promise.all([laterCount({ sessionId, view, m }), api.context(sessionId)]);
  const anchor = ctx.verbatim_since_message_id;
  const rewinds = anchor !== null && m.id < anchor;
  return openDialog({
    title: t("edit_title"),
    text: editWarning(count, rewinds),
    confirm: t("edit_confirm"),
    danger: true,
  });
}

// The inline editor on message `node`; `stream.resend(m, text)` does the rest.
export function editMessage({ sessionId, view, stream, node, m }) {
  const body = node.querySelector(".msg-body");
  const area = el("textarea", { class: "edit-input", "aria-label": t("edit"), rows: "4" });
  area.value = m.content;
  const save = el("button", { type: "submit", class: "btn primary small", text: t("edit_send") });
  const cancel = el("button", { type: "button", class: "btn small", text: t("cancel") });
  const form = el("form", { class: "edit-form" }, area, el("div", { class: "edit-actions" }, save, cancel));
  body.classList.remove("folded");
  body.replaceChildren(form);
  node.querySelector(".msg-actions")?.setAttribute("hidden", "");
  node.querySelector(".fold-btn")?.setAttribute("hidden", "");
  area.focus();
  area.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      cancel.click();
    }
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  cancel.addEventListener("click", () => view.refresh(m));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = area.value;
    if (!text.trim()) return;
    let ok;
    try {
      ok = await confirmEdit({ sessionId, view, m });
    } catch (err) {
      errorNotice(err);
      return;
    }
    if (ok) await stream.resend(m, text);
    else area.focus();
  });
}
