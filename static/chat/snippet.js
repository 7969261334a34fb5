// A search hit's snippet as runs of text, each marked or not; pure (no DOM), so search-hits.js
// can build it from text nodes and <mark> elements only and tests/js can run it under Node.

// `highlights`: [start, end) in code points of `snippet` (the API's unit), merged and clamped
// here so a bad pair can neither throw nor repeat text. Returns [{ text, marked }], in order,
// whose texts join back into `snippet`.
export function snippetParts(snippet, highlights) {
  const chars = Array.from(snippet);
  const ranges = [];
  for (const [a, b] of [...(highlights || [])].sort((x, y) => x[0] - y[0])) {
    const start = Math.max(0, a);
    const end = Math.min(chars.length, b);
    if (!(start < end)) continue;
    const last = ranges[ranges.length - 1];
    if (last && start <= last[1]) last[1] = Math.max(last[1], end);
    else ranges.push([start, end]);
  }
  const parts = [];
  let at = 0;
  for (const [start, end] of ranges) {
    if (start > at) parts.push({ text: chars.slice(at, start).join(""), marked: false });
    parts.push({ text: chars.slice(start, end).join(""), marked: true });
    at = end;
  }
  if (at < chars.length) parts.push({ text: chars.slice(at).join(""), marked: false });
  return parts;
}
