// In-page dialogs instead of window.prompt / window.confirm: a modal <dialog> (the rest of the
// page is inert while it is open), labelled by its heading and described by its text, Tab kept
// inside it, Esc cancels, and focus goes back where it was. One at a time.

import { el, t } from "./dom.js";

const FOCUSABLE = "button:not([disabled]), input:not([disabled]), textarea:not([disabled]), [href]";

function trapTab(dialog, e) {
  if (e.key !== "Tab") return;
  const items = [...dialog.querySelectorAll(FOCUSABLE)];
  if (!items.length) return;
  const first = items[0];
  const last = items[items.length - 1];
  if (e.shiftKey && document.activeElement === first) {
    e.preventDefault();
    last.focus();
  } else if (!e.shiftKey && document.activeElement === last) {
    e.preventDefault();
    first.focus();
  }
}

// `title`, `text`: what is asked; `confirm`: the confirming button's label; `danger`: it
// destroys something (red, and focus starts on Cancel); `input`: { label, value, maxLength }
// for a text answer. Resolves with the text (input), true (confirmed) or null (cancelled).
export function openDialog({ title, text = "", confirm, danger = false, input = null }) {
  const opener = document.activeElement;
  const field = input
    ? el("input", { type: "text", id: "dialog-input", class: "dialog-input", maxlength: input.maxLength || 200, autocomplete: "off" })
    : null;
  if (field) field.value = input.value || "";
  const cancel = el("button", { type: "button", class: "btn", "data-dialog": "cancel", text: t("cancel") });
  const ok = el("button", { type: "submit", class: danger ? "btn danger" : "btn primary", "data-dialog": "confirm", text: confirm });
  const form = el("form", { method: "dialog", class: "dialog-form" },
    el("h2", { id: "dialog-title", text: title }),
    text ? el("p", { id: "dialog-text", text }) : null,
    field ? el("label", { for: "dialog-input", class: "dialog-label", text: input.label }) : null,
    field,
    el("div", { class: "dialog-actions" }, cancel, ok));
  const dialog = el("dialog", {
    class: "dialog",
    id: "app-dialog",
    "aria-labelledby": "dialog-title",
    "aria-describedby": text ? "dialog-text" : null,
    "data-danger": danger ? "true" : null,
  }, form);
  document.getElementById("app-dialog")?.remove();
  document.body.append(dialog);
  return new Promise((resolve) => {
    let answer = null;
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (field && !field.value.trim()) {
        field.focus();
        return;
      }
      answer = field ? field.value.trim() : true;
      dialog.close();
    });
    cancel.addEventListener("click", () => dialog.close());
    dialog.addEventListener("keydown", (e) => trapTab(dialog, e));
    dialog.addEventListener("close", () => {
      dialog.remove();
      if (opener && opener.isConnected) opener.focus();
      resolve(answer);
    });
    dialog.showModal();
    if (field) {
      field.focus();
      field.select();
    } else (danger ? cancel : ok).focus();
  });
}
