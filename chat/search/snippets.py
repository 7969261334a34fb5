"""What a search hit shows of its message: a short excerpt around the first match, with every
match inside it marked by offsets (never HTML: the client inserts text, so a message's own markup
can never become the page's)."""

from __future__ import annotations

import re
from dataclasses import dataclass

SNIPPET_CHARS = 160
# Context kept before the first match, so the reader sees what leads up to it.
_LEAD = 50
ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class Snippet:
    text: str
    # [start, end) offsets into `text`, in Unicode code points (not UTF-16 units: a browser
    # slices with Array.from(text)), in order and never overlapping.
    highlights: list[tuple[int, int]]


def query_pattern(query: str) -> re.Pattern[str]:
    return re.compile(re.escape(query), re.IGNORECASE)


def snippet_for(content: str, query: str, *, chars: int = SNIPPET_CHARS) -> Snippet:
    """The excerpt of `content` around the first case-insensitive occurrence of `query`.

    Line breaks become spaces one for one, so offsets found in the content hold in the
    excerpt. If the database matched where Python's case folding does not (a character SQLite's
    or PostgreSQL's folding treats differently), the excerpt is the message's start, unmarked."""
    pattern = query_pattern(query)
    first = pattern.search(content)
    start = 0 if first is None else max(0, first.start() - _LEAD)
    end = min(len(content), start + chars)
    if first is not None and end < first.end():  # a query longer than the excerpt
        end = first.end()
    # Start at a word boundary when one is near, rather than mid-word.
    if start > 0:
        space = content.find(" ", start, first.start() if first else end)
        if 0 <= space < start + 15:
            start = space + 1
    raw = content[start:end]
    prefix = ELLIPSIS if start > 0 else ""
    suffix = ELLIPSIS if end < len(content) else ""
    shift = len(prefix)
    highlights = [(m.start() + shift, m.end() + shift) for m in pattern.finditer(raw)]
    body = raw.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    return Snippet(text=prefix + body + suffix, highlights=highlights)
