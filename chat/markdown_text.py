"""Text written into Markdown files that other renderers read (the export, an agent's daily
notes): kept as Markdown only where it cannot add or hide a heading, else fenced. A message
must not make a file show turns that never happened, nor swallow the ones after it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

from markdown_it import MarkdownIt
from markdown_it.token import Token


def markdown_fenced(text: str) -> str:
    """`text` in a code fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def markdown_code_span(text: str) -> str:
    """`text` on one line as inline code, whatever backticks it holds."""
    line = " ".join(text.split()) or "?"
    longest = max((len(run) for run in re.findall(r"`+", line)), default=0)
    ticks = "`" * (longest + 1)
    return f"{ticks} {line} {ticks}" if longest else f"`{line}`"


# What can make a heading (ATX or setext, also inside a quote or a list), a fence or raw HTML;
# text without any of it is Markdown as it is, without being parsed.
_RISKY = re.compile(r"[#<]|`{3}|~{3}|^[ \t>]*(?:=+|-+)[ \t]*$", re.M)
# A fence line at column 0: always at the top level (indented up to 3 spaces it could belong
# to a list item, so such text is parsed instead).
_FENCE = re.compile(r"(`{3,}|~{3,})(.*)")
# An ATX heading at the top level: the text is fenced, no parse needed to know it.
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)", re.M)
_PROBE = "\n\n## probe\n"


@lru_cache(maxsize=1)
def _commonmark() -> MarkdownIt:
    # Raw HTML on: the file is read by other renderers, which show <h2> as a heading.
    return MarkdownIt("commonmark", {"html": True})


def _outside_fences(text: str) -> tuple[str, bool]:
    """The lines of `text` outside its top-level fenced code, and whether every fence it
    opens is closed. A reply's code blocks (# comments, <tags>) are most of what makes a
    message look risky; outside them there is usually nothing to parse for."""
    outside: list[str] = []
    fence = ""
    for line in text.split("\n"):
        match = _FENCE.fullmatch(line)
        if not fence:
            # A backtick fence's info string holds no backtick (else it is inline code).
            if match and not (match[1][0] == "`" and "`" in match[2]):
                fence = match[1]
            else:
                outside.append(line)
        elif (
            match
            and match[1][0] == fence[0]
            and len(match[1]) >= len(fence)
            and not match[2].strip()
        ):
            fence = ""
    return "\n".join(outside), not fence


def markdown_plain(text: str) -> bool:
    """Whether `text` can go into the export as Markdown: it makes no heading and no raw
    HTML, and leaves nothing open (a fence, an HTML block) that would swallow the headings
    after it. Decided without parsing when the text outside its closed code blocks has nothing
    risky (or a plain heading); else by parsing it with a heading after it, which must stay
    the only one."""
    if not _RISKY.search(text):
        return True
    outside, closed = _outside_fences(text)
    if closed and not _RISKY.search(outside):
        return True
    if _HEADING.search(outside):
        return False
    tokens = _commonmark().parse(text + _PROBE)
    headings = [t for t in tokens if t.type == "heading_open"]
    html = any(t.type == "html_block" or t.type == "html_inline" for t in _walk(tokens))
    return not html and len(headings) == 1 and tokens[-3].type == "heading_open"


def _walk(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield token
        if token.children:
            yield from token.children
