"""chat/rendering.py: what a reply's Markdown becomes (highlighting, math, tables, task lists,
links) and that the sanitiser still holds over all of it."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from chat.rendering import HIGHLIGHT_MAX_CHARS, highlight_css, render_markdown

ROOT = Path(__file__).resolve().parents[2]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


def test_code_is_coloured_by_token_class_and_keeps_its_language() -> None:
    html = render_markdown("```python\ndef f(x):\n    return x < 2  # c\n```")
    assert '<pre><code class="language-python">' in html
    assert '<span class="hl-k">def</span>' in html
    assert '<span class="hl-c1"># c</span>' in html
    assert "&lt;" in html  # the code's own < stays text


def test_unknown_language_and_huge_blocks_stay_plain_text() -> None:
    unknown = render_markdown("```nosuchlang\na < b\n```")
    assert unknown == '<pre><code class="language-nosuchlang">a &lt; b\n</code></pre>\n'
    huge = render_markdown("```python\n" + "x = 1\n" * (HIGHLIGHT_MAX_CHARS // 6 + 1) + "```")
    assert "hl-" not in huge and huge.startswith('<pre><code class="language-python">x = 1')


@pytest.mark.parametrize(
    ("source", "display"),
    [
        (r"a $x\,y$ b", False),
        (r"a \(x\,y\) b", False),
        ("$$\nx\\,y\n$$", True),
        ("\\[\nx\\,y\n\\]", True),
    ],
)
def test_math_becomes_mathml_with_its_tex_source(source: str, display: bool) -> None:
    html = render_markdown(source)
    wrapper = "div" if display else "span"
    css = "math-block" if display else "math-inline"
    assert f'<{wrapper} class="{css}"><math display="{"block" if display else "inline"}">' in html
    # The thin space is a MathML space, and the source keeps its backslash.
    assert '<mspace width="0.167em"></mspace>' in html
    assert '<annotation encoding="application/x-tex">x\\,y</annotation>' in html


def test_prices_are_not_math_and_bad_tex_shows_its_source() -> None:
    assert render_markdown("costs $5 and $6") == "<p>costs $5 and $6</p>\n"
    bad = render_markdown(r"$\frac{1}{$")
    assert bad == '<p><span class="math-error"><code>\\frac{1}{</code></span></p>\n'


def test_table_alignment_becomes_classes() -> None:
    html = render_markdown("| a | b | c | d |\n|:--|:-:|--:|---|\n| 1 | 2 | 3 | 4 |")
    assert '<th class="align-left">a</th>' in html
    assert '<th class="align-center">b</th>' in html
    assert '<td class="align-right">3</td>' in html
    assert "<td>4</td>" in html and "style" not in html


def test_task_lists_are_disabled_checkboxes_in_labels() -> None:
    html = render_markdown("- [ ] todo\n- [x] done")
    assert '<ul class="contains-task-list">' in html
    assert (
        '<label><input class="task-list-item-checkbox" disabled="disabled" type="checkbox"> todo'
        in html
    )
    assert 'checked="checked" disabled="disabled" type="checkbox"> done' in html


def test_bare_urls_become_links() -> None:
    html = render_markdown("see https://example.org/a?b=1 and www.example.com.")
    assert (
        '<a href="https://example.org/a?b=1" rel="noopener nofollow noreferrer">'
        "https://example.org/a?b=1</a>"
    ) in html
    assert '<a href="http://www.example.com" rel="noopener nofollow noreferrer">' in html


@pytest.mark.parametrize(
    "payload",
    [
        '<span class="hl-k" onclick="x()">a</span>',
        '<input type="text" onfocus="x()" autofocus>',
        '<math><mi href="javascript:x()">a</mi></math>',
        "$<img src=x onerror=x()>$",
        "\\(\\href{javascript:x()}{a}\\)",
        "```python\n<script>x()</script>\n```",
        "| <b onclick=x()>a</b> |\n|:-:|\n| 1 |",
        "- [ ] <svg onload=x()>",
        "javascript:x() www.javascript:x().com",
    ],
)
def test_new_formats_do_not_open_the_sanitiser(payload: str) -> None:
    tags = _Tags()
    tags.feed(render_markdown(payload))
    assert tags.found, "the payload rendered to nothing"
    for tag, attrs in tags.found:
        assert tag not in {"script", "img", "svg", "b", "style", "iframe"}, tag
        for name, value in attrs:
            assert not name.startswith("on") and name not in {"style", "autofocus", "src"}
            assert not (value or "").lower().startswith("javascript")
            if tag == "input" and name == "type":
                assert value == "checkbox"


def test_the_served_highlight_css_is_what_pygments_makes() -> None:
    served = (ROOT / "static" / "chat" / "highlight.css").read_text()
    assert served == highlight_css(), "regenerate static/chat/highlight.css (see highlight_css)"
    assert "@media (prefers-color-scheme: dark)" in served and ".markdown pre .hl-k" in served


@pytest.mark.parametrize(
    ("tex", "shown"),
    [
        # Copied unescaped by latex2mathml, these were parsed as HTML by the sanitiser: text
        # lost ("ad"), or a real heading made from a formula (a probe).
        (r"$\text{a<b and c>d}$", "<mtext>a&lt;b&nbsp;and&nbsp;c&gt;d</mtext>"),
        (r"$\text{<h1>Session expired</h1>}$", "<mtext>&lt;h1&gt;Session&nbsp;expired"),
        (r"$\text{x \& y}$", "&amp;"),
    ],
)
def test_text_inside_math_is_text(tex, shown):
    html = render_markdown(tex)
    assert shown in html
    assert "<h1>" not in html and "<table>" not in html


@pytest.mark.parametrize(
    ("tex", "kept"),
    [
        (r"\[\rule{3000cm}{3000cm}\]", None),  # was a message 113,000 px tall
        (r"$\hspace{5000cm}x$", None),
        (r"$\kern-900px x$", None),
        (r"$\hspace{1em}x$", 'width="1em"'),
        (r"$\hspace{-0.5em}x$", 'width="-0.5em"'),
    ],
)
def test_math_lengths_are_kept_modest(tex, kept):
    html = render_markdown(tex)
    assert "<math" in html
    if kept is None:
        assert "width=" not in html and "height=" not in html
    else:
        assert kept in html
