"""Replies and daily notes as the pages show them (chat/rendering.py's Markdown), kept in this
process, and bounded in what one request may render.

A reply with code, a table and a formula takes milliseconds to render (Pygments, latex2mathml,
nh3): a history page of 25 such replies, ~50-90 ms of the chat opening. The same page is asked
for again and again (a reload, switching back to a chat, scrolling back over it), and a
finished reply never changes: each is rendered once per process.

Rendering costs with the text (10-16 us a character for lists and tables, a review): a reply
longer than REPLY_RENDER_RUNES_MAX is not rendered (the page shows it as text, as it shows the
user's messages, and so does a streaming reply, which the page shows as text until it ends);
one whose HTML would be over ENTRY_RUNES_MAX (an empty-celled table grows tenfold) is rendered
once and remembered as shown as text; and a history page stops starting renders after
PAGE_RENDER_SECONDS, newest reply first (the rest come without `content_html`, show as text,
and are rendered by a later read). Else one user could hold an HTTP thread for seconds with
every read of a page of long replies, and every thread with eight (a probe, a review).

Keyed by what is rendered: the message's id (a note's agent and day) and its content's
length and hash, not the text (a collision would need two versions of one message's text, and
Python's string hash is seeded per process), so a reply edited in the admin, or regenerated
under the same id, is rendered anew. Bounded by the HTML held (CACHE_RUNES_MAX), least
recently used first out.
"""

from __future__ import annotations

import html
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.rendering import render_markdown

# Up to 4 bytes a character (Python keeps emoji text so; ASCII 1): 8-32 MB per process.
CACHE_RUNES_MAX = 8_000_000
# A rendering over this is not kept, nor sent: the reply is shown as text.
ENTRY_RUNES_MAX = CACHE_RUNES_MAX // 16
# A reply longer than this is shown as text (~0.5 s of rendering at most).
REPLY_RENDER_RUNES_MAX = 32_000
# A history page starts no render after this long rendering.
PAGE_RENDER_SECONDS = 0.5
# A daily note longer than this is shown as preformatted text.
NOTE_RENDER_RUNES_MAX = 64_000
# What a remembered "shown as text" costs in the cache's bound.
_MARKER_RUNES = 64
_AS_TEXT = ""

_clock = time.monotonic  # tests move it
_lock = threading.Lock()
_kept: OrderedDict[Hashable, str] = OrderedDict()
_kept_runes = 0


def page_html(messages: Sequence[ChatMessage]) -> list[str | None]:
    """Each finished reply of a history page rendered; None for other messages, and for
    replies shown as text (past the bounds above)."""
    out: list[str | None] = [None] * len(messages)
    started = _clock()
    # Newest first: the page opens at its bottom, and what the budget leaves is older.
    for i in reversed(range(len(messages))):
        message = messages[i]
        content = message.content
        if (
            message.role != MessageRole.ASSISTANT
            or message.status == MessageStatus.STREAMING
            or len(content) > REPLY_RENDER_RUNES_MAX
        ):
            continue
        key = ("reply", message.pk, len(content), hash(content))
        found = _kept_get(key)
        if found is None:
            if _clock() - started > PAGE_RENDER_SECONDS:
                continue
            found = _rendered(key, content, render_markdown)
        out[i] = found or None
    return out


def note_html(*, agent_id: str, day: str, markdown: str) -> str:
    """A daily note's readable Markdown rendered; as preformatted text past
    NOTE_RENDER_RUNES_MAX (a note grows all day, a message's worth at a time), or when its
    HTML would be over ENTRY_RUNES_MAX."""
    key = ("note", agent_id, day, len(markdown), hash(markdown))
    found = _kept_get(key)
    if found is None:
        if len(markdown) > NOTE_RENDER_RUNES_MAX:
            return _preformatted(markdown)
        found = _rendered(key, markdown, render_markdown)
    return found or _preformatted(markdown)


def _preformatted(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>\n"


def _kept_get(key: Hashable) -> str | None:
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
        return found


def _rendered(key: Hashable, content: str, render: Callable[[str], str]) -> str:
    """`content` rendered and kept under `key`; _AS_TEXT (kept too) when its HTML is over
    ENTRY_RUNES_MAX: rendering it again would only make it again to throw away."""
    made = render(content)
    if len(made) > ENTRY_RUNES_MAX:
        made = _AS_TEXT
    _keep(key, made)
    return made


def _keep(key: Hashable, made: str) -> None:
    global _kept_runes
    with _lock:
        old = _kept.pop(key, None)
        if old is not None:
            _kept_runes -= max(len(old), _MARKER_RUNES)
        _kept[key] = made
        _kept_runes += max(len(made), _MARKER_RUNES)
        while _kept_runes > CACHE_RUNES_MAX:
            _, dropped = _kept.popitem(last=False)
            _kept_runes -= max(len(dropped), _MARKER_RUNES)


def rendered_forget() -> None:
    """Drop every kept rendering (tests: ids come back after a rolled-back test on SQLite)."""
    global _kept_runes
    with _lock:
        _kept.clear()
        _kept_runes = 0
