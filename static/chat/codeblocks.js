// What the server's HTML for a reply lacks and only the page can add: on every code block a
// language label and a Copy button, and the block itself focusable (a labelled region), so a
// keyboard user can scroll a long line sideways. The HTML itself is never touched: the nodes
// are built here with textContent.

import { el, t } from "./dom.js";

// "language-python" → "python"; a block without a fence language is "text".
export function codeLanguage(code) {
  const found = /(?:^|\s)language-([^\s]+)/.exec(code.className || "");
  return found ? found[1] : "";
}

async function copyCode(button, code) {
  try {
    await navigator.clipboard.writeText(code.textContent);
    button.textContent = t("copied");
    setTimeout(() => (button.textContent = t("copy")), 1500);
  } catch {
    // Clipboard refused (permissions): the text can still be selected by hand.
  }
}

export function decorateCodeBlocks(body) {
  for (const pre of body.querySelectorAll("pre")) {
    if (pre.parentElement.classList.contains("code-block")) continue;
    const code = pre.querySelector("code") || pre;
    const language = codeLanguage(code);
    const shown = language || t("code_plain");
    const button = el("button", {
      type: "button",
      class: "code-copy",
      "aria-label": t("code_copy", { language: shown }),
      text: t("copy"),
    });
    button.addEventListener("click", () => copyCode(button, code));
    const head = el("div", { class: "code-head" }, el("span", { class: "code-lang", text: shown }), button);
    pre.setAttribute("tabindex", "0");
    pre.setAttribute("role", "region");
    pre.setAttribute("aria-label", t("code_region", { language: shown }));
    const block = el("div", { class: "code-block" });
    pre.replaceWith(block);
    block.append(head, pre);
  }
  // A wide display formula scrolls sideways too.
  for (const math of body.querySelectorAll(".math-block")) {
    math.setAttribute("tabindex", "0");
    math.setAttribute("role", "region");
    math.setAttribute("aria-label", t("math_region"));
  }
}
