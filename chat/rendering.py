"""Server-side Markdown for the chat page: one function, `render_markdown(text) -> str`.

Model output and user input are both untrusted, so the pipeline is belt and braces:
markdown-it-py with raw HTML *disabled* (a `<script>` in the text becomes escaped text, never a
tag), then nh3 (ammonia) with an explicit allow-list over the result, so even a renderer bug or
a crafted link cannot smuggle a script, an event handler or a `javascript:` URL into the page.
"""

from __future__ import annotations

from functools import lru_cache

import nh3
from markdown_it import MarkdownIt

# Only what CommonMark + GFM tables/strikethrough produce. No img: a remote image in a model
# reply would be a tracking pixel (and CSP allows only same-origin / data: images anyway).
_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    # The fenced-code language ("language-python") so CSS/JS can label the block.
    "code": {"class"},
    "ol": {"start"},
}
# Table alignment comes as style="text-align:..." and is dropped: the CSP forbids inline styles.
_URL_SCHEMES = {"http", "https", "mailto"}


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    # "js-default" = CommonMark with html disabled and linkify off; tables + strikethrough on.
    md = MarkdownIt("js-default", {"breaks": True})
    md.enable(["table", "strikethrough"])
    return md


def _filter_class(tag: str, attr: str, value: str) -> str | None:
    # Keep only the language class markdown-it puts on fenced code; drop anything else.
    if tag == "code" and attr == "class":
        ok = value.startswith("language-") and value.replace("-", "").isalnum()
        return value if ok else None
    return value


def render_markdown(text: str) -> str:
    """Safe HTML for `text` (untrusted). Links get rel="noopener nofollow noreferrer"."""
    html = _md().render(text or "")
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_URL_SCHEMES,
        link_rel="noopener nofollow noreferrer",
        attribute_filter=_filter_class,
        strip_comments=True,
    )
