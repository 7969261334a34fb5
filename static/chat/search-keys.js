// The search box's keyboard: the shortcuts that bring focus to it (`/`, Ctrl+K / Cmd+K), and
// the results as a listbox the arrows move through while focus stays in the box
// (aria-activedescendant).

// Focus is in something that takes typing: `/` is a character there, not a shortcut.
function typingIn(node) {
  return Boolean(node && (node.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(node.tagName)));
}

export function isSearchShortcut(e) {
  const slash = e.key === "/" && !e.ctrlKey && !e.metaKey && !e.altKey && !typingIn(document.activeElement);
  const chord = (e.ctrlKey || e.metaKey) && !e.altKey && !e.shiftKey && e.key.toLowerCase() === "k";
  return slash || chord;
}

export class HitListbox {
  #input;
  #list;

  constructor(input, list) {
    this.#input = input;
    this.#list = list;
  }

  get options() {
    return [...this.#list.children];
  }

  get activeIndex() {
    const id = this.#input.getAttribute("aria-activedescendant");
    return id ? this.options.findIndex((n) => n.id === id) : -1;
  }

  // The option shown as chosen; an index past either end chooses none.
  setActive(index) {
    const all = this.options;
    for (const n of all) n.setAttribute("aria-selected", "false");
    const node = all[index];
    if (!node) {
      this.clearActive();
      return;
    }
    node.setAttribute("aria-selected", "true");
    this.#input.setAttribute("aria-activedescendant", node.id);
    node.scrollIntoView({ block: "nearest" });
  }

  clearActive() {
    this.#input.removeAttribute("aria-activedescendant");
  }

  // ArrowDown / ArrowUp, stopping at either end. false: no results, the key is not the list's.
  step(key) {
    const count = this.options.length;
    if (!count) return false;
    const at = this.activeIndex;
    this.setActive(key === "ArrowDown" ? Math.min(at + 1, count - 1) : Math.max(at - 1, 0));
    return true;
  }

  // What Enter opens: the chosen hit, or with nothing chosen the newest; null without results.
  chosen() {
    return this.options[Math.max(this.activeIndex, 0)] ?? null;
  }
}
