// Markdown as plain text, for the places that show a message as a line of text (search
// snippets, the Questions list): `**demo**` reads "demo". Pure (no DOM), so tests/js run it.
// Not a Markdown parser: it drops the marks a reader would otherwise see literally, and keeps
// every other character where it was, so a snippet's highlight ranges can follow (a mask).

const WORD = /[\p{L}\p{N}]/u;
const SPACE = /\s/u;

// The run of `ch` starting at `i`.
function runLength(chars, i, ch) {
  let n = 0;
  while (chars[i + n] === ch) n += 1;
  return n;
}

// An emphasis run (`*`, `**`, `_`, `~~`) is a mark when it touches text on one side and not
// whitespace on both ("2 * 3" keeps its star); `_` inside a word (snake_case) is a letter.
function isDelimiter(chars, i, n, ch) {
  const before = chars[i - 1];
  const after = chars[i + n];
  const textBefore = before !== undefined && !SPACE.test(before);
  const textAfter = after !== undefined && !SPACE.test(after);
  if (!textBefore && !textAfter) return false;
  if (ch === "_" && before && after && WORD.test(before) && WORD.test(after)) return false;
  if (ch === "~") return n === 2;
  return n <= 3;
}

// Underscores are marks only in pairs (`_this_`): unpaired they are part of a name
// (`window.__xss`), unlike stars, whose unpaired run is usually one a snippet's edge cut off.
// Marks the closing run in `drop` when there is one on the same line.
function closesLater(chars, i, n, drop) {
  for (let j = i + n; j < chars.length && chars[j] !== "\n"; j += 1) {
    if (chars[j] !== "_") continue;
    const m = runLength(chars, j, "_");
    if (m === n && !SPACE.test(chars[j - 1]) && isDelimiter(chars, j, m, "_")) {
      for (let k = j; k < j + m; k += 1) drop[k] = true;
      return true;
    }
    j += m - 1;
  }
  return false;
}

// Marks at the start of a line: heading hashes, quote arrows, list bullets, each with the space
// after it. Returns how many characters to drop at `i`.
function lineStart(chars, i) {
  let j = i;
  while (chars[j] === " " && j - i < 3) j += 1;
  let n;
  if (chars[j] === "#") {
    n = runLength(chars, j, "#");
    if (n > 6 || (chars[j + n] !== " " && chars[j + n] !== undefined)) return 0;
  } else if (chars[j] === ">") n = 1;
  else if ((chars[j] === "-" || chars[j] === "+" || chars[j] === "*") && chars[j + 1] === " ") n = 1;
  else return 0;
  while (chars[j + n] === " ") n += 1;
  return j - i + n;
}

// `[text](url)` and `![alt](url)`: the brackets and the target go, the text stays. Marks the
// dropped positions in `drop`; returns the index to continue from, or -1 when `i` starts none.
function link(chars, i, drop) {
  const open = chars[i] === "!" && chars[i + 1] === "[" ? i + 1 : chars[i] === "[" ? i : -1;
  if (open < 0) return -1;
  let close = open + 1;
  while (close < chars.length && chars[close] !== "]" && chars[close] !== "\n") close += 1;
  if (chars[close] !== "]" || chars[close + 1] !== "(") return -1;
  let end = close + 2;
  while (end < chars.length && chars[end] !== ")" && !SPACE.test(chars[end])) end += 1;
  if (chars[end] !== ")") return -1;
  for (let k = i; k <= open; k += 1) drop[k] = true;
  for (let k = close; k <= end; k += 1) drop[k] = true;
  return open + 1;
}

// One boolean per code point of `text`: keep it (true) or it is a Markdown mark (false).
export function plainMask(text) {
  const chars = Array.from(text);
  const drop = new Array(chars.length).fill(false);
  let i = 0;
  let atLineStart = true;
  while (i < chars.length) {
    const ch = chars[i];
    if (atLineStart) {
      atLineStart = false;
      const n = lineStart(chars, i);
      if (n) {
        for (let k = i; k < i + n; k += 1) drop[k] = true;
        i += n;
        continue;
      }
    }
    if (ch === "\n") {
      atLineStart = true;
      i += 1;
      continue;
    }
    const next = link(chars, i, drop);
    if (next >= 0) {
      i = next;
      continue;
    }
    if (ch === "`") {
      const n = runLength(chars, i, ch);
      for (let k = i; k < i + n; k += 1) drop[k] = true;
      i += n;
      continue;
    }
    if (ch === "*" || ch === "_" || ch === "~") {
      const n = runLength(chars, i, ch);
      if (isDelimiter(chars, i, n, ch) && (ch !== "_" || closesLater(chars, i, n, drop))) {
        for (let k = i; k < i + n; k += 1) drop[k] = true;
      }
      i += n;
      continue;
    }
    i += 1;
  }
  return drop.map((d) => !d);
}

// The text without its marks, whitespace runs folded to one space.
export function plainText(text) {
  const chars = Array.from(text || "");
  const keep = plainMask(text || "");
  return chars
    .filter((_, i) => keep[i])
    .join("")
    .replace(/\s+/g, " ")
    .trim();
}

// `parts` ({ text, marked } runs, snippet.js) with the marks taken out; a highlight keeps
// covering the same words. Runs left empty go; neighbours of one kind merge.
export function plainParts(parts) {
  const whole = parts.map((p) => p.text).join("");
  const keep = plainMask(whole);
  const out = [];
  let at = 0;
  for (const part of parts) {
    let text = "";
    for (const ch of Array.from(part.text)) {
      if (keep[at]) text += ch;
      at += 1;
    }
    text = text.replace(/\s+/g, " ");
    if (!text) continue;
    const last = out[out.length - 1];
    if (last && last.marked === part.marked) last.text += text;
    else out.push({ text, marked: part.marked });
  }
  return out;
}
