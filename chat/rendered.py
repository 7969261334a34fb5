"""Replies and daily notes as the pages show them (chat/rendering.py's Markdown), kept in this
process, and bounded in what one request may render.

A reply with code, a table and a formula takes milliseconds to render (Pygments, latex2mathml,
nh3): a history page of 25 such replies, ~50-90 ms of the chat opening. The same page is asked
for again and again (a reload, switching back to a chat, scrolling back over it), and a
finished reply never changes: each is rendered once per process.

Rendering costs with the text (~5 us a character; a list of 25,000 items took 2 s): a reply
longer than REPLY_RENDER_RUNES_MAX is not rendered (the page shows it as text, as it shows
the user's messages), and one history page renders at most PAGE_RENDER_RUNES of text not
rendered before (the rest of its replies come without `content_html` and show as text; the
next read of the page renders them). Else one user could hold an HTTP thread for minutes
with a page of long replies, and every thread with eight (a probe).

Keyed by what is rendered: the message's id (a note's agent and day) and its content's
length and hash, not the text (a collision would need two versions of one message's text, and
Python's string hash is seeded per process), so a reply edited in the admin, or regenerated
under the same id, is rendered anew. Only finished replies are kept: a streaming one's text
changes until it ends. Bounded by the HTML held (CACHE_RUNES_MAX), least recently used first
out.
"""

from __future__ import annotations

import html
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.rendering import render_markdown

# ~2 bytes a character at most for the HTML kept (ASCII 1): ~8-16 MB per process.
CACHE_RUNES_MAX = 8_000_000
# A rendering over this is made every time: it would push out every other.
ENTRY_RUNES_MAX = CACHE_RUNES_MAX // 16
# A reply longer than this is shown as text (~0.5 s of rendering).
REPLY_RENDER_RUNES_MAX = 100_000
# Text a history page renders that is not kept from an earlier read (~2 s at most).
PAGE_RENDER_RUNES = 400_000
# A daily note longer than this is shown as preformatted text.
NOTE_RENDER_RUNES_MAX = 200_000

_lock = threading.Lock()
_kept: OrderedDict[Hashable, str] = OrderedDict()
_kept_runes = 0


def page_html(messages: Sequence[ChatMessage]) -> list[str | None]:
    """Each reply of a history page rendered (None for other messages, and for replies past
    the bounds above)."""
    left = PAGE_RENDER_RUNES
    out: list[str | None] = []
    for message in messages:
        found = None
        content = message.content
        if message.role == MessageRole.ASSISTANT and len(content) <= REPLY_RENDER_RUNES_MAX:
            final = message.status != MessageStatus.STREAMING
            key = ("reply", message.pk, len(content), hash(content))
            found = _kept_get(key) if final else None
            if found is None and len(content) <= left:
                left -= len(content)
                found = _rendered(key, content, render_markdown, keep=final)
        out.append(found)
    return out


def note_html(*, agent_id: str, day: str, markdown: str) -> str:
    """A daily note's readable Markdown rendered; as preformatted text past
    NOTE_RENDER_RUNES_MAX (a note grows all day, a message's worth at a time)."""
    key = ("note", agent_id, day, len(markdown), hash(markdown))
    found = _kept_get(key)
    if found is not None:
        return found
    if len(markdown) > NOTE_RENDER_RUNES_MAX:
        return _rendered(key, markdown, _preformatted, keep=True)
    return _rendered(key, markdown, render_markdown, keep=True)


def _preformatted(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>\n"


def _kept_get(key: Hashable) -> str | None:
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
        return found


def _rendered(key: Hashable, content: str, render: Callable[[str], str], *, keep: bool) -> str:
    made = render(content)
    if keep and len(made) <= ENTRY_RUNES_MAX:
        _keep(key, made)
    return made


def _keep(key: Hashable, made: str) -> None:
    global _kept_runes
    with _lock:
        old = _kept.pop(key, None)
        if old is not None:
            _kept_runes -= len(old)
        _kept[key] = made
        _kept_runes += len(made)
        while _kept_runes > CACHE_RUNES_MAX:
            _, dropped = _kept.popitem(last=False)
            _kept_runes -= len(dropped)


def rendered_forget() -> None:
    """Drop every kept rendering (tests: ids come back after a rolled-back test on SQLite)."""
    global _kept_runes
    with _lock:
        _kept.clear()
        _kept_runes = 0
