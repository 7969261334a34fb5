"""Server-side Markdown for the chat page: one function, `render_markdown(text) -> str`.

Model output and user input are both untrusted, so the pipeline is belt and braces:
markdown-it-py with raw HTML *disabled* (a `<script>` in the text becomes escaped text, never a
tag), then nh3 (ammonia) with an explicit allow-list over the result, so even a renderer bug or
a crafted link cannot smuggle a script, an event handler or a `javascript:` URL into the page.

What it formats, all on the server so stored and streamed replies (a streamed one is fetched
rendered once it ends, static/chat/stream.js) go through the same code and the page ships no
parser: GFM tables with their alignment (as classes: the CSP forbids style attributes), task
lists, strikethrough, bare URLs (with a scheme or www.; linkify-it-py), fenced code coloured
by Pygments (token classes; static/chat/highlight.css colours them), and TeX math
(`$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]`) as MathML by latex2mathml, which Chromium, Firefox
and Safari draw natively: no KaTeX script, fonts or inline styles. The TeX source rides along
as the MathML annotation, so copying a formula keeps every backslash (`\\,` included).
"""

from __future__ import annotations

import html
import logging
import re
from functools import lru_cache
from typing import Any

import nh3
from latex2mathml.converter import convert as latex_to_mathml
from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.tasklists import tasklists_plugin
from mdit_py_plugins.texmath import texmath_plugin
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

logger = logging.getLogger(__name__)

# Pygments' token classes get this prefix, so the sanitiser can tell them from anything else.
TOKEN_PREFIX = "hl-"  # noqa: S105 - a CSS class prefix, not a secret
# A fenced block longer than this is shown uncoloured: Pygments is linear, but a megabyte of
# code in one reply should not cost the history request a second.
HIGHLIGHT_MAX_CHARS = 100_000
# Longer TeX is shown as its source: latex2mathml's cost grows with nesting.
MATH_MAX_CHARS = 5_000
# markdown-it's link and image rules cost ~70 us for every "[" (a probe: a reply of 48,000
# took 3 s, and "![" 4 s, on every history read): past this many a text is rendered without
# them, "[text](url)" left as text (bare URLs are still linked). ~35 ms at most.
LINK_BRACKETS_MAX = 500
# Math delimiters ("$", "\(", "\[") past which a text is rendered without math, its TeX
# shown as text: every formula is ~180 bytes of MathML ("$a$ " 10,000 times: 1.8 MB, a
# probe). Up to 300 formulas.
MATH_MARKERS_MAX = 600
# texmath's "\(" rule copies and scans the rest of its paragraph at every "\(" it tries, so
# a paragraph of them cost the square of its length (40,000 characters: 6.4 s, a probe), and
# its "\[" rule the rest of the text. Past this many characters scanned in all, counted from
# above (~0.1 s), a text is rendered without math.
MATH_SCAN_MAX = 10_000_000
# dollarmath's "$$" block rule walks the lines after each "$$" in Python (a review: 300 "$$"
# lines each closed off by a heading, 4.6 s for 100,000 characters, 1.5 s for 32,000): past
# this many lines walked in all, counted from above (~0.1 s), no math either.
MATH_BLOCK_LINES_MAX = 300_000
# Task-list items ("- [ ]", "- [x]") past which they are rendered as plain list items: the
# tasklists plugin walks back to the list's start from each one (5,000: 4.1 s, a probe).
TASK_ITEMS_MAX = 200
_TASK_ITEM_RE = re.compile(r"\[[ xX]\]")

_MATHML_TAGS = {
    "math", "semantics", "annotation", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace",
    "msup", "msub", "msubsup", "mfrac", "msqrt", "mroot", "mover", "munder", "munderover",
    "mtable", "mtr", "mtd", "mstyle", "mpadded", "mphantom", "menclose", "merror",
}  # fmt: skip
# Only what CommonMark + GFM produce, plus MathML. No img: a remote image in a model reply
# would be a tracking pixel (and CSP allows only same-origin / data: images anyway).
_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a", "span", "div", "label", "input",
    "table", "thead", "tbody", "tr", "th", "td",
} | _MATHML_TAGS  # fmt: skip
_MATH_ATTRIBUTES = {
    "display", "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "width",
    "height", "depth", "columnalign", "rowalign", "columnspacing", "rowspacing", "columnlines",
    "rowlines", "frame", "linethickness", "accent", "accentunder", "movablelimits", "largeop",
    "symmetric", "minsize", "maxsize", "form", "displaystyle", "scriptlevel", "notation",
    "encoding",
}  # fmt: skip
_ATTRIBUTES: dict[str, set[str]] = {
    "a": {"href", "title"},
    # The fenced-code language ("language-python") so the page can label the block.
    "code": {"class"},
    "ol": {"start"},
    "span": {"class"},
    "div": {"class"},
    "th": {"class"},
    "td": {"class"},
    "ul": {"class"},
    "li": {"class"},
    # A task list's box: only ever a disabled checkbox (see _filter_attribute).
    "input": {"type", "checked", "disabled", "class"},
    **{tag: _MATH_ATTRIBUTES for tag in _MATHML_TAGS},
}
_URL_SCHEMES = {"http", "https", "mailto"}

_LANGUAGE_CLASS = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")
_TOKEN_CLASSES = re.compile(rf"{TOKEN_PREFIX}[a-z0-9]{{1,6}}( {TOKEN_PREFIX}[a-z0-9]{{1,6}})*")
_FIXED_CLASSES = {
    "div": {"math-block", "math-error"},
    "span": {"math-inline", "math-error"},
    "th": {"align-left", "align-center", "align-right"},
    "td": {"align-left", "align-center", "align-right"},
    "ul": {"contains-task-list"},
    "li": {"task-list-item"},
    "input": {"task-list-item-checkbox"},
}
_ALIGN = re.compile(r"text-align:(left|center|right)")


def _filter_attribute(tag: str, attr: str, value: str) -> str | None:
    """Classes only from a fixed list (and Pygments' prefixed token classes); an input is
    always a disabled checkbox whatever the markup said."""
    if attr == "class":
        if tag == "code":
            return value if _LANGUAGE_CLASS.fullmatch(value) else None
        if tag == "span" and _TOKEN_CLASSES.fullmatch(value):
            return value
        return value if value in _FIXED_CLASSES.get(tag, ()) else None
    if tag == "input":
        return {"type": "checkbox", "disabled": "disabled", "checked": "checked"}.get(attr)
    if attr in _MATH_LENGTHS and not _length_modest(value):
        return None  # the element keeps its natural size
    return value


# MathML lengths a formula may set, and how large (either sign) by unit: `\rule{3000cm}` made
# a message 113,000 px tall, `\hspace{5000cm}` one 189,000 px wide (a probe).
_MATH_LENGTHS = {"width", "height", "depth", "lspace", "rspace", "minsize", "maxsize"}
_LENGTH = re.compile(r"\s*-?(\d{1,6}(?:\.\d*)?|\.\d+)\s*([a-z%]*)\s*")
_LENGTH_MAX = {"em": 20, "ex": 40, "mu": 360, "cm": 15, "mm": 150, "in": 6, "pt": 430, "pc": 36}
_LENGTH_MAX |= {"px": 580, "%": 100, "": 20}


def _length_modest(value: str) -> bool:
    found = _LENGTH.fullmatch(value)
    if found is None:
        return value.strip() in {"thin", "medium", "thick", "auto", "infinity"}
    limit = _LENGTH_MAX.get(found.group(2))
    return limit is not None and float(found.group(1)) <= limit


def _highlight(code: str, lang: str, _attrs: str) -> str:
    """Pygments' token spans for a fenced block in a language it knows; "" (markdown-it then
    escapes the text itself) for none, an unknown one or a huge block."""
    name = lang.strip().split(maxsplit=1)[0] if lang.strip() else ""
    if not name or len(code) > HIGHLIGHT_MAX_CHARS:
        return ""
    lexer = _lexer(name.lower())
    return highlight(code, lexer, _formatter()) if lexer is not None else ""


@lru_cache(maxsize=128)
def _lexer(name: str) -> Lexer | None:
    # Looking a name up walks Pygments' whole lexer table (a millisecond); a lexer instance
    # keeps no state between texts, so one per language serves every block.
    try:
        return get_lexer_by_name(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=1)
def _formatter() -> HtmlFormatter[str]:
    # nowrap: markdown-it adds the <pre><code class="language-…"> around it.
    return HtmlFormatter(nowrap=True, classprefix=TOKEN_PREFIX)


# Pygments styles whose every token colour keeps WCAG AA (4.5:1) on the page's code
# background (--code-bg in app.css): xcode on #f1f3f6, one-dark on #11131a.
HIGHLIGHT_STYLES = {"light": "xcode", "dark": "one-dark"}
_HIGHLIGHT_SCOPE = ".markdown pre"


def highlight_css() -> str:
    """static/chat/highlight.css: the token colours only (the block's own background and
    text colour stay the page's), light, then dark under prefers-color-scheme. Written by
    `python -c 'from chat.rendering import highlight_css as c; print(c(), end="")'
    > static/chat/highlight.css`; tests/chat/test_rendering.py checks the file matches."""

    def tokens(style: str) -> str:
        formatter = HtmlFormatter(style=style, classprefix=TOKEN_PREFIX)
        return "\n".join(formatter.get_token_style_defs(_HIGHLIGHT_SCOPE))

    dark = "\n".join("  " + line for line in tokens(HIGHLIGHT_STYLES["dark"]).splitlines())
    return (
        f"/* Generated from Pygments ({HIGHLIGHT_STYLES['light']} / "
        f"{HIGHLIGHT_STYLES['dark']}) by chat.rendering.highlight_css(); do not edit. */\n"
        f"{tokens(HIGHLIGHT_STYLES['light'])}\n"
        f"@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
    )


def _math(tex: str, *, display: bool) -> str:
    """MathML for `tex`, with the source as its annotation; the escaped source when it does
    not parse (a reply's "$5 and $6" that slipped through, or TeX latex2mathml lacks)."""
    tag, css = ("div", "math-block") if display else ("span", "math-inline")
    source = html.escape(tex.strip())
    if len(tex) <= MATH_MAX_CHARS:
        try:
            mathml = latex_to_mathml(tex.strip(), display="block" if display else "inline")
        except Exception:
            logger.debug("math did not convert", exc_info=True)
        else:
            annotation = f'<annotation encoding="application/x-tex">{source}</annotation>'
            mathml = _text_escaped(mathml)
            inner = mathml.split(">", 1)[1].rsplit("</math>", 1)[0]
            opening = mathml.split(">", 1)[0] + ">"
            mathml = f"{opening}<semantics><mrow>{inner}</mrow>{annotation}</semantics></math>"
            return f'<{tag} class="{css}">{mathml}</{tag}>'
    return f'<{tag} class="math-error"><code>{source}</code></{tag}>'


# What latex2mathml writes: MathML tags and character references. Anything else in its output
# is text it copied from the TeX unescaped (`\text{a<b}`, `\&`): the sanitiser parsed that
# as HTML, which lost text ("a<b and c>d" showed "ad") and let `\text{<h1>...}` make a
# heading (a probe).
_MATHML_PIECE = re.compile(
    rf"(</?(?:{'|'.join(sorted(_MATHML_TAGS))})(?:\s[^<>]*)?/?>"
    r"|&(?:#x[0-9a-fA-F]+|#[0-9]+|[a-zA-Z][a-zA-Z0-9]*);)"
)


def _text_escaped(mathml: str) -> str:
    parts = _MATHML_PIECE.split(mathml)
    return "".join(p if i % 2 else html.escape(p, quote=False) for i, p in enumerate(parts))


def _math_rule(display: bool) -> Any:
    def render(self: Any, tokens: list[Token], idx: int, options: Any, env: Any) -> str:
        out = _math(tokens[idx].content, display=display)
        return out + "\n" if display else out

    return render


def _alignment_classes(state: Any) -> None:
    """markdown-it writes a column's alignment as style="text-align:…"; the CSP forbids
    style attributes, so it becomes a class the stylesheet aligns."""
    for token in state.tokens:
        if token.type not in {"th_open", "td_open"}:
            continue
        style = token.attrGet("style")
        if style is None:
            continue
        token.attrs.pop("style", None)
        found = _ALIGN.search(str(style))
        if found:
            token.attrSet("class", f"align-{found.group(1)}")


@lru_cache(maxsize=16)
def _md(*, linkify: bool, math: bool, links: bool = True, tasks: bool = True) -> MarkdownIt:
    """A parser with only the rules a text can need: linkify's scan and the math rules cost
    a millisecond or two per message, several times the rest, on a history page of 50.
    `links` False: no link or image syntax (LINK_BRACKETS_MAX); `tasks` False: no task lists
    (TASK_ITEMS_MAX)."""
    # "js-default" = CommonMark with html disabled; tables and strikethrough on.
    md = MarkdownIt("js-default", {"breaks": True, "linkify": linkify, "highlight": _highlight})
    md.enable(["table", "strikethrough"])
    if not links:
        md.disable(["link", "image", "reference"])
    if linkify:
        md.enable("linkify")
    if tasks:
        md.use(tasklists_plugin, label=True)
    if math:
        # \( \) and \[ \] (what most models write), then $ and $$. No space inside the
        # dollars and no digit after the closing one, so "costs $5 and $6" stays text.
        md.use(texmath_plugin, delimiters="brackets")
        md.use(dollarmath_plugin, allow_space=False, allow_digits=False, allow_labels=False)
        for name in ("math_inline", "math_inline_double"):
            md.add_render_rule(name, _math_rule(display=name == "math_inline_double"))
        for name in ("math_block", "math_block_eqno", "math_block_label"):
            md.add_render_rule(name, _math_rule(display=True))
    md.core.ruler.push("alignment_classes", _alignment_classes)
    return md


def _parser_for(text: str) -> MarkdownIt:
    # What linkify-it can link (a scheme, "www.", an e-mail address) and what can open math.
    linkify = "://" in text or "www." in text or "@" in text
    markers = text.count("$") + text.count("\\(") + text.count("\\[")
    return _md(
        linkify=linkify,
        math=0 < markers <= MATH_MARKERS_MAX and _math_affordable(text),
        links=text.count("[") <= LINK_BRACKETS_MAX,
        tasks=len(_TASK_ITEM_RE.findall(text)) <= TASK_ITEMS_MAX,
    )


def _math_affordable(text: str) -> bool:
    """Whether the math rules' scans stay within MATH_SCAN_MAX and MATH_BLOCK_LINES_MAX:
    each paragraph's length times its "\\(", the text's length times its "\\[", its lines
    times its "$$"."""
    if text.count("$$") * (text.count("\n") + 1) > MATH_BLOCK_LINES_MAX:
        return False
    scanned = text.count("\\[") * len(text)
    if "\\(" in text:
        scanned += sum(p.count("\\(") * len(p) for p in text.split("\n\n") if "\\(" in p)
    return scanned <= MATH_SCAN_MAX


# nh3 converts its allow-lists on every call, and the MathML ones are most of them (a
# millisecond a message): only text that rendered math gets them.
_PLAIN_TAGS = _TAGS - _MATHML_TAGS
_PLAIN_ATTRIBUTES = {tag: names for tag, names in _ATTRIBUTES.items() if tag not in _MATHML_TAGS}


def render_markdown(text: str) -> str:
    """Safe HTML for `text` (untrusted). Links get rel="noopener nofollow noreferrer"."""
    rendered = _parser_for(text or "").render(text or "")
    math = "<math" in rendered
    return nh3.clean(
        rendered,
        tags=_TAGS if math else _PLAIN_TAGS,
        attributes=_ATTRIBUTES if math else _PLAIN_ATTRIBUTES,
        url_schemes=_URL_SCHEMES,
        link_rel="noopener nofollow noreferrer",
        attribute_filter=_filter_attribute,
        strip_comments=True,
    )
